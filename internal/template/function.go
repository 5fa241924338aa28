package template

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"syscall"

	"github.com/torpor-dev/torpor/internal/agentproto"
	"github.com/torpor-dev/torpor/internal/sandbox"
)

// Function is a function template: a process in the function's sandbox
// with its code imported, parked as a fork server. It is never consumed:
// every Fork makes one more instance.
type Function struct {
	spec  FunctionSpec
	log   *slog.Logger
	sb    *sandbox.Sandbox
	cl    *agentproto.Client
	exits *exitTable // its instances, by pid in its namespace
	Hello agentproto.Hello
}

// ErrInheritedSockets means an instance forked from a function template
// found a socket open besides its control socket — the template's code
// opened one (a connection made at import time, say), which every fork
// would share. Such a function cannot be forked: retire the template and
// start its instances one by one.
var ErrInheritedSockets = errors.New("the function template holds open sockets (opened by the function's code at import?), which forked instances would share")

// Client is the function template's agent connection: send it init (to
// import the code) before the first Fork.
func (f *Function) Client() *agentproto.Client { return f.cl }

// Sandbox is the function template's process and cgroup.
func (f *Function) Sandbox() *sandbox.Sandbox { return f.sb }

// Pid is the function template's host pid.
func (f *Function) Pid() int { return f.sb.Pid() }

// Done is closed when the function template has exited.
func (f *Function) Done() <-chan struct{} { return f.sb.Done() }

// Fork forks an instance with sandbox (cgroup) id and limits, and returns
// it with a Client that has done the handshake: the instance serves
// invokes at once. Forks of one template are serialised on its socket.
func (f *Function) Fork(ctx context.Context, id string, limits sandbox.Limits) (*sandbox.Sandbox, *agentproto.Client, error) {
	conn, child, err := agentproto.SocketPair(true)
	if err != nil {
		return nil, nil, fmt.Errorf("fork %s: %w", id, err)
	}
	nsPid, err := f.cl.Fork(ctx, agentproto.TypeFork, nil, child)
	child.Close()
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("fork %s from %s: %w", id, f.spec.ID, err)
	}
	cl, hello, err := agentproto.HandshakeForked(ctx, conn)
	if err != nil {
		conn.Close()
		f.exits.forget(nsPid)
		return nil, nil, fmt.Errorf("instance %s forked from %s: %w", id, f.spec.ID, err)
	}
	sb, report, err := f.sb.Manager().Adopt(ctx, id, hello.HostPid, limits)
	if err != nil {
		cl.Close() // its end of the socket closes: the agent exits
		f.exits.forget(nsPid)
		return nil, nil, fmt.Errorf("instance %s: %w", id, err)
	}
	f.exits.bind(nsPid, func(ws syscall.WaitStatus) { report(ws) })
	n, err := cl.Started(ctx)
	if err == nil && n > 0 {
		err = fmt.Errorf("it found %d: %w", n, ErrInheritedSockets)
	}
	if err != nil {
		cl.Close()
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("instance %s forked from %s: %w", id, f.spec.ID, err)
	}
	return sb, cl, nil
}

// Close stops the function template and every instance forked from it.
func (f *Function) Close(ctx context.Context) error {
	_ = f.cl.Close()
	return f.sb.Destroy(ctx)
}
