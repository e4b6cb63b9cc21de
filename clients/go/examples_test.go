package deadbolt_test

// The README's examples, run as a user would run them (`go run
// ./examples/...`) against a real server: each must do what its comment
// says, not only compile (issue 61, part 5).

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deadbolt/deadbolt-go/internal/testserver"
)

// example is the built ./examples/<name> with `-endpoint <the shared
// server> args...`, stopped with the test. Built with `go build` (what
// `go run` does first) so that a signal reaches the example itself.
func example(t *testing.T, ctx context.Context, name string, args ...string) *exec.Cmd {
	t.Helper()
	if shared == nil {
		testserver.Available(t)
	}
	program := filepath.Join(t.TempDir(), name)
	build := exec.CommandContext(ctx, "go", "build", "-o", program, "./examples/"+name)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/%s: %v\n%s", name, err, out)
	}
	args = append([]string{"-endpoint", shared.Endpoint}, args...)
	return exec.CommandContext(ctx, program, args...)
}

func output(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	return string(out)
}

func TestExampleCronRunsTheJobOnceAndSkipsWhileHeld(t *testing.T) {
	ctx := within(t, 2*time.Minute)
	lock := "examples/cron-test"
	out := output(t, example(t, ctx, "cron", "-lock", lock))
	if !regexp.MustCompile(`report sent under token \d+`).MatchString(out) {
		t.Fatalf("the job did not run:\n%s", out)
	}
	// Another host holds the lock: the job is skipped, with exit code 0.
	client := connect(t)
	held, err := client.Lock(within(t, 10*time.Second), lock)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	out = output(t, example(t, ctx, "cron", "-lock", lock))
	if !strings.Contains(out, "another host is sending the report: skipping") {
		t.Fatalf("the job was not skipped:\n%s", out)
	}
}

func TestExampleFencedWriteRefusesTheStaleHolder(t *testing.T) {
	out := output(t, example(t, within(t, 2*time.Minute), "fencedwrite"))
	for _, want := range []string{
		`"A's first draft" with token`,
		"B is granted the lock with token",
		`the document: "B's final text"`,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
	stale := regexp.MustCompile(`"A's stale draft" with token \d+: 409`)
	if !stale.MatchString(out) {
		t.Fatalf("the stale write was not refused with 409:\n%s", out)
	}
}

func TestExampleLeaderLeadsAndResignsOnInterrupt(t *testing.T) {
	ctx := within(t, 2*time.Minute)
	cmd := example(t, ctx, "leader", "-election", "examples/leader-test", "-value", "10.0.0.7:8080")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var seen []string
	for lines.Scan() {
		seen = append(seen, lines.Text())
		if strings.HasPrefix(lines.Text(), "  scheduling, term") {
			break
		}
	}
	joined := strings.Join(seen, "\n")
	if !strings.Contains(joined, "leading in term") || !strings.Contains(joined, `"10.0.0.7:8080" leads in term`) {
		t.Fatalf("the example did not lead and observe itself:\n%s", joined)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go func() {
		for lines.Scan() {
		}
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the example did not stop cleanly on SIGINT: %v", err)
	}
	// It resigned: nobody leads any more.
	leader, err := connect(t).Leader(within(t, 10*time.Second), "examples/leader-test")
	if err != nil {
		t.Fatal(err)
	}
	if leader != nil {
		t.Fatalf("still led after the example stopped: %+v", leader)
	}
}
