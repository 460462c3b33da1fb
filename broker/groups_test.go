package broker_test

import (
	"context"
	"slices"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
)

// Issue #35: one submission's runs share a group the broker draws, which
// only the token that started it can add runs to, and ListRuns filters
// by it within the caller's scope.
func TestRunGroups(t *testing.T) {
	t.Parallel()
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := brokertest.Start(t, brokertest.NewDB(t, kind), brokertest.Fast())
			owner := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
			other := dialRuns(t, b, b.Token(t, store.RoleSubmit, "*"))
			usReader := dialRuns(t, b, b.Token(t, store.RoleRead, "us-*"))

			first := submit(t, owner, "us-west-2", nil)
			if first.Group == "" {
				t.Fatalf("first run of a submission has no group: %v", first)
			}
			second := submit(t, owner, "eu-central-1", func(r *gpupassv1.SubmitRequest) { r.Group = first.Group })
			lone := submit(t, owner, "us-west-2", nil)
			if second.Group != first.Group || lone.Group == first.Group {
				t.Fatalf("groups: first %s, joined %s, new %s; want the joined one equal to the first, the new one not", first.Group, second.Group, lone.Group)
			}

			list := func(c interface {
				ListRuns(context.Context, *connect.Request[gpupassv1.ListRunsRequest]) (*connect.Response[gpupassv1.ListRunsResponse], error)
			}, group string) ([]string, error) {
				resp, err := c.ListRuns(ctx, connect.NewRequest(&gpupassv1.ListRunsRequest{Group: group}))
				if err != nil {
					return nil, err
				}
				var ids []string
				for _, r := range resp.Msg.Runs {
					ids = append(ids, r.Id+"/"+r.Group)
				}
				return ids, nil
			}
			got, err := list(owner.Run, first.Group)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{first.Id + "/" + first.Group, second.Id + "/" + first.Group}, got); diff != "" {
				t.Errorf("runs --group (-want +got):\n%s", diff)
			}
			// The group filter keeps the token's scope: a us reader sees
			// the group's us run only.
			if got, err := list(usReader.Run, first.Group); err != nil || !slices.Equal(got, []string{first.Id + "/" + first.Group}) {
				t.Errorf("runs --group by a us-* reader = %v, %v; want only %s", got, err, first.Id)
			}

			for _, tc := range []struct {
				name string
				c    func() error
				want connect.Code
			}{
				{"another token joins the group", func() error {
					_, err := other.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t),
						Region: "eu-central-1", Command: []string{"true"}, Group: first.Group}))
					return err
				}, connect.CodePermissionDenied},
				{"an unknown group", func() error {
					_, err := owner.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t),
						Region: "eu-central-1", Command: []string{"true"}, Group: "group-0123456789abcdef"}))
					return err
				}, connect.CodePermissionDenied},
				{"not a group id", func() error {
					_, err := owner.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{SpecYaml: specYAML(t),
						Region: "eu-central-1", Command: []string{"true"}, Group: "' OR 1=1"}))
					return err
				}, connect.CodeInvalidArgument},
				{"list a malformed group", func() error {
					_, err := list(owner.Run, "group-x")
					return err
				}, connect.CodeInvalidArgument},
			} {
				if err := tc.c(); connect.CodeOf(err) != tc.want {
					t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
				}
			}
			// The refused submission stored nothing in the group.
			if got, err := list(owner.Run, first.Group); err != nil || len(got) != 2 {
				t.Errorf("group after refusals = %v, %v; want its 2 runs", got, err)
			}
		})
	}
}
