// Package testserver starts real, throwaway `deadbolt server` processes
// for the client's tests: the binary at $DEADBOLT_BIN, or the repository's
// target/debug/deadbolt. Without one, tests are skipped, unless
// DEADBOLT_REQUIRE_CLIENTS is set, when they fail.
package testserver

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// Server is one single-node server on loopback with a data directory of
// its own.
type Server struct {
	// Endpoint is the server's URL.
	Endpoint string
	bin      string
	listen   string
	dir      string
	cmd      *exec.Cmd
	exited   chan struct{}
	extra    []string
}

// Binary is the server binary the tests run, and whether it exists.
func Binary() (string, bool) {
	bin := os.Getenv("DEADBOLT_BIN")
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		// clients/go/internal/testserver/testserver.go -> the repository root
		root := filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
		bin = filepath.Join(root, "target", "debug", "deadbolt")
	}
	info, err := os.Stat(bin)
	return bin, err == nil && !info.IsDir()
}

// Required reports whether a missing server binary fails the tests.
func Required() bool { return os.Getenv("DEADBOLT_REQUIRE_CLIENTS") != "" }

// Available skips tb (or fails it, under DEADBOLT_REQUIRE_CLIENTS) when
// there is no server binary.
func Available(tb testing.TB) string {
	tb.Helper()
	bin, ok := Binary()
	if !ok {
		message := fmt.Sprintf("no deadbolt server binary at %s: build it (cargo build -p deadbolt-cli) or set DEADBOLT_BIN", bin)
		if Required() {
			tb.Fatal(message + " (DEADBOLT_REQUIRE_CLIENTS is set)")
		}
		tb.Skip("skipped: " + message)
	}
	return bin
}

// FreePort is a TCP port on 127.0.0.1 nobody listens on (as of now).
func FreePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a server, stopped (and its directory removed) when tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := Available(tb)
	dir := tb.TempDir()
	s, err := StartAt(bin, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartAt starts a server of bin with its data in dir (for TestMain,
// which has no testing.TB). Stop it with Stop.
func StartAt(bin, dir string) (*Server, error) {
	listen := fmt.Sprintf("127.0.0.1:%d", FreePort())
	s := &Server{Endpoint: "http://" + listen, bin: bin, listen: listen, dir: dir}
	return s, s.start()
}

func (s *Server) start() error {
	log, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	args := append([]string{"server", "--listen", s.listen, "--data-dir", filepath.Join(s.dir, "data")}, s.extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start %s: %w", s.bin, err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	s.exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			text, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			return fmt.Errorf("deadbolt server exited: %s", text)
		default:
		}
		if resp, err := client.Get(s.Endpoint + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("deadbolt server at %s not ready within 20s", s.Endpoint)
}

// Freeze stops the server (SIGSTOP): it answers nothing and renews
// nothing, while connections stay open.
func (s *Server) Freeze() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Kill kills the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
		}
	}
}

// Restart starts the killed server again, on the same address and data.
func (s *Server) Restart() error { return s.start() }

// Stop kills the server.
func (s *Server) Stop() { s.Kill() }

// Cluster is a cluster of nodes on loopback, in a plain-text cluster
// with a peer secret.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts size nodes (3 or 5), stopped when tb ends, and
// waits until one of them leads.
func StartCluster(tb testing.TB, size int) *Cluster {
	tb.Helper()
	bin := Available(tb)
	dir := tb.TempDir()
	secret := filepath.Join(dir, "peer-secret")
	if out, err := exec.Command(bin, "peer-secret", "new", secret).CombinedOutput(); err != nil {
		tb.Fatalf("deadbolt peer-secret new: %v: %s", err, out)
	}
	c := &Cluster{}
	var initial string
	for id := 1; id <= size; id++ {
		listen := fmt.Sprintf("127.0.0.1:%d", FreePort())
		node := &Server{Endpoint: "http://" + listen, bin: bin, listen: listen, dir: filepath.Join(dir, fmt.Sprint(id))}
		if err := os.MkdirAll(node.dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		if initial != "" {
			initial += ","
		}
		initial += fmt.Sprintf("%d=%s", id, listen)
		c.Nodes = append(c.Nodes, node)
	}
	errs := make(chan error, size)
	for id, node := range c.Nodes {
		node.extra = []string{"--node-id", fmt.Sprint(id + 1), "--initial-cluster", initial, "--peer-secret-file", secret}
		go func(node *Server) { errs <- node.start() }(node)
	}
	tb.Cleanup(func() {
		for _, node := range c.Nodes {
			node.Stop()
		}
	})
	for range c.Nodes {
		if err := <-errs; err != nil {
			tb.Fatal(err)
		}
	}
	c.Leader(tb, 20*time.Second)
	return c
}

// Endpoints are every node's URL.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, node := range c.Nodes {
		out = append(out, node.Endpoint)
	}
	return out
}

// Leader is the index in Nodes of the node that leads (its /health
// answers 200), waited for up to limit.
func (c *Cluster) Leader(tb testing.TB, limit time.Duration) int {
	tb.Helper()
	client := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for i, node := range c.Nodes {
			resp, err := client.Get(node.Endpoint + "/health")
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("no leader within %v", limit)
	return -1
}
