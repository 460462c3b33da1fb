package health

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestProtoRoundTrip keeps proto.go the one complete conversion: a field
// added to Score or to HealthScore and not converted fails it.
func TestProtoRoundTrip(t *testing.T) {
	t.Parallel()
	var s Score
	testutil.FillFields(t, &s)
	p := s.ToProto()
	testutil.AllProtoFieldsSet(t, p)
	if diff := cmp.Diff(&s, FromProto(p)); diff != "" {
		t.Errorf("FromProto(ToProto(s)) (-want +got):\n%s", diff)
	}
	if FromProto(nil) != nil {
		t.Error("FromProto(nil) is not nil")
	}
	if h := s.Fill(new(gpupassv1.HealthScore)); h.GetPricePenalty() != s.PricePenalty {
		t.Errorf("Fill: price_penalty %v, want %v", h.GetPricePenalty(), s.PricePenalty)
	}
}
