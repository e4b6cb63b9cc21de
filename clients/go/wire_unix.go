//go:build unix

package deadbolt

import "syscall"

// closedWhileIdle reports whether the server closed c (or reset it, or
// sent something nobody asked for) while it sat in the pool: a look at the
// socket that does not wait finds an end of file, an error or bytes.
// net/http's Transport learns it from the reader goroutine it keeps on
// every connection; this asks the socket once, when the connection is
// taken.
func (c *wireConn) closedWhileIdle() bool {
	if c.reader.Buffered() > 0 {
		return true
	}
	sc, ok := c.conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	err = raw.Read(func(fd uintptr) bool {
		var one [1]byte
		n, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n > 0 || (err == nil && n == 0) || (err != nil && err != syscall.EAGAIN && err != syscall.EWOULDBLOCK)
		return true // done: never wait for the socket
	})
	return closed || err != nil
}
