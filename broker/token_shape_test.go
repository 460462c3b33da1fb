package broker_test

import (
	"context"
	"testing"

	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/workdir"
)

// The work dir packer refuses files holding a token by its shape; a
// minted token must have that shape, or a config.json full of them ships.
func TestMintedTokenLooksLikeToken(t *testing.T) {
	t.Parallel()
	s := brokertest.NewDB(t, "sqlite").Open(t)
	for range 20 {
		tok, _, err := broker.CreateToken(context.Background(), s, store.RoleSubmit, []string{"*"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if !workdir.LooksLikeToken([]byte(`{"token": "` + tok + `"}`)) {
			t.Fatalf("workdir.LooksLikeToken does not recognise the minted token %.8s…", tok)
		}
	}
}
