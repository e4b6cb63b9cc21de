package main

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deadbolt/deadbolt-go/internal/testserver"
)

// TestProtocol drives the built driver as the conformance suite does: a
// grant, a busy try_lock, status, a timed-out wait, release, close.
func TestProtocol(t *testing.T) {
	server := testserver.Start(t)
	bin := filepath.Join(t.TempDir(), "conformance-driver")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	id := 0
	call := func(command map[string]any) map[string]any {
		t.Helper()
		id++
		command["id"] = id
		line, _ := json.Marshal(command)
		if _, err := stdin.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
		if !lines.Scan() {
			t.Fatal("the driver exited")
		}
		var answer map[string]any
		if err := json.Unmarshal(lines.Bytes(), &answer); err != nil || answer["id"] != float64(id) {
			t.Fatalf("answer %s: %v", lines.Bytes(), err)
		}
		return answer
	}
	ok := func(command map[string]any) map[string]any {
		t.Helper()
		answer := call(command)
		result, found := answer["ok"].(map[string]any)
		if !found {
			t.Fatalf("%v: %v", command, answer)
		}
		return result
	}
	ok(map[string]any{"op": "connect", "endpoints": []string{server.Endpoint}})
	a := ok(map[string]any{"op": "open", "ttl_ms": 10000})["session"]
	b := ok(map[string]any{"op": "open", "ttl_ms": 10000})["session"]
	token := ok(map[string]any{"op": "lock", "session": a, "name": "p"})["token"]
	if busy := ok(map[string]any{"op": "try_lock", "session": b, "name": "p"}); busy["token"] != nil {
		t.Fatalf("try_lock of a held lock: %v", busy)
	}
	if status := ok(map[string]any{"op": "status", "name": "p"}); status["holder"] != a || status["token"] != token {
		t.Fatalf("status %v", status)
	}
	started := time.Now()
	timedOut := call(map[string]any{"op": "lock", "session": b, "name": "p", "timeout_ms": 300})
	if kind := timedOut["error"].(map[string]any)["kind"]; kind != "wait_timeout" || time.Since(started) < 250*time.Millisecond {
		t.Fatalf("a timed wait: %v", timedOut)
	}
	ok(map[string]any{"op": "release", "session": a, "name": "p"})
	handle := ok(map[string]any{"op": "handle", "session": a})
	if ttl := ok(map[string]any{"op": "keep_alive_handle", "session_id": handle["session_id"], "secret": handle["secret"]}); ttl["ttl_ms"] != float64(10000) {
		t.Fatalf("keep_alive_handle: %v", ttl)
	}
	ok(map[string]any{"op": "close", "session": a})
	if bad := call(map[string]any{"op": "open", "ttl_ms": 100}); bad["error"].(map[string]any)["kind"] != "invalid_argument" {
		t.Fatalf("a 100ms TTL: %v", bad)
	}
}
