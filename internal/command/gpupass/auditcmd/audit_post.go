package auditcmd

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/keylessflags"
	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// SectionSignedBy names the audit's section in the sticky report comment.
const SectionSignedBy = "signed-by"

// sectionPoster is what the audit needs of the forge poster cmd/gpupass
// links in (forgepost.Poster): its section set in the sticky comment.
type sectionPoster interface {
	PostSection(ctx context.Context, to compare.PostMode, o compare.Options, s forge.Section) (*forge.Result, error)
}

// PostFlags say where the audit says who signed besides the step summary:
// the sticky comment compare posts (its flags, named as compare names
// them, so that a pipeline's one set of GPUPASS_* variables serves both
// steps).
type PostFlags struct {
	Post        string
	Tag         string
	PullRequest int64
	GitHubToken string
	GitLabToken string
	// Poster is the forge poster cmd/gpupass links in (g.Poster); one
	// that cannot set a section (or nil) posts nothing.
	Poster compare.Poster
}

// AddFlags registers the posting flags of `gpupass audit`.
func (p *PostFlags) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&p.Post, "post", "auto", "where to say who signed and how to verify, in the sticky report comment compare posts (its --tag): auto (in a CI step, -o github|gitlab, on a pull or merge request), github, gitlab or none")
	f.StringVar(&p.Tag, "tag", "compare", "the sticky report comment (compare's --tag) the signed-by section goes into")
	f.Int64Var(&p.PullRequest, "pull-request", 0, "pull request (GitHub) or merge request iid (GitLab) to comment on when the CI event names none (0: the event's)")
	f.StringVar(&p.GitHubToken, "github-token", "", "token for the PR comment (default $GITHUB_TOKEN); needs pull-requests: write")
	f.StringVar(&p.GitLabToken, "gitlab-token", "", "project access token for the MR note (default $GITLAB_TOKEN)")
	gpupass.MarkSecret("github-token")
	gpupass.MarkSecret("gitlab-token")
}

// signedBySection is the audit's section of the sticky comment: who
// signed the report at path (a zip, or a group's directory) and the
// command that verifies it, quoted to work pasted. Nothing secret goes
// in: the identity comes from the certificate, a key is named only as
// its public half.
func signedBySection(path, mode string, sb *audit.SignedBy, trustedRoot string) forge.Section {
	clean := strings.NewReplacer("`", "'", "\n", " ", "\r", " ", "|", "\\|").Replace
	var b strings.Builder
	b.WriteString("#### gpupass audit: signed by\n\n")
	var cmd string
	if sb != nil && sb.Identity != "" {
		fmt.Fprintf(&b, "Signed by `%s` (`%s`)", clean(sb.Identity), clean(sb.Issuer))
		var parts []string
		for _, kv := range [][2]string{{"repository", sb.Repository}, {"workflow", sb.Workflow}, {"ref", sb.Ref}, {"commit", sb.Commit}} {
			if kv[1] != "" {
				parts = append(parts, fmt.Sprintf("%s `%s`", kv[0], clean(kv[1])))
			}
		}
		if len(parts) > 0 {
			b.WriteString(" — " + strings.Join(parts, ", "))
		}
		b.WriteString(".\n")
		cmd = "gpupass audit verify " + termsafe.ShellQuote(path) + keylessflags.VerifyArgs(sb.Identity, sb.Issuer, trustedRoot)
	} else {
		fmt.Fprintf(&b, "Signed with the pipeline's cosign key (%s); `cosign.pub` below is its public half.\n", clean(mode))
		cmd = "gpupass audit verify " + termsafe.ShellQuote(path) + " --key cosign.pub"
	}
	fmt.Fprintf(&b, "\nVerify `%s` (among the job's artifacts) with:\n\n```sh\n%s\n```\n", clean(path), strings.NewReplacer("\n", " ", "\r", " ").Replace(cmd))
	return forge.Section{Name: SectionSignedBy, Markdown: b.String()}
}

// postSection sets s in the sticky report comment when the flags and the
// CI say there is one, and says on ErrOut what it did. The audit's proof
// is the zip and its signature, not the comment: a post that fails is a
// warning there, not an error of the step.
func (o AuditOptions) postSection(ctx context.Context, s forge.Section) {
	w := o.ErrOut
	if w == nil {
		w = io.Discard
	}
	res, warning := o.postSignedBy(ctx, s)
	switch {
	case warning != "":
		fmt.Fprintf(w, "warning: %s\n", warning)
	case res != nil:
		fmt.Fprintf(w, "report comment: %s section %s (%s)%s\n", s.Name, res.Action, res.Reason, urlNote(res.URL))
	}
}

func urlNote(u string) string {
	if u == "" {
		return ""
	}
	return ": " + u
}

func (o AuditOptions) postSignedBy(ctx context.Context, s forge.Section) (_ *forge.Result, warning string) {
	p := o.PostTo
	mode, _ := compare.ParsePostMode(p.Post) // checked by RunAudit
	if _, isCI := gpupass.CIOutput(o.Output); mode == compare.PostAuto && !isCI {
		// Outside a CI step the audit says who signed on stdout only.
		return nil, ""
	}
	getenv := auditGetenv(o.Getenv)
	to := compare.Destination(mode, getenv)
	if to == compare.PostNone {
		return nil, ""
	}
	poster, ok := p.Poster.(sectionPoster)
	if !ok {
		return nil, "this gpupass cannot post to " + string(to) + "; nothing posted"
	}
	res, err := poster.PostSection(ctx, to, compare.Options{
		Post: mode, Tag: p.Tag, GitHubToken: p.GitHubToken, GitLabToken: p.GitLabToken, PullRequest: p.PullRequest,
		Getenv: getenv, Logger: auditLog(o.Log),
	}, s)
	if err != nil {
		return nil, fmt.Sprintf("who signed was not added to the report comment (the step summary and this log say it): %v", err)
	}
	return res, ""
}
