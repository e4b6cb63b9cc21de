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
	cmd := exec.Command(s.bin, "server", "--listen", s.listen, "--data-dir", filepath.Join(s.dir, "data"))
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
