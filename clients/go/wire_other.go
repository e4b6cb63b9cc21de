//go:build !unix

package deadbolt

// closedWhileIdle cannot look at the socket here: a connection the server
// closed is found out by the call that uses it (see wire.call).
func (c *wireConn) closedWhileIdle() bool { return false }
