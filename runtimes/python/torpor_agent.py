"""torpor Python agent: runs Lambda-style Python handlers for a torpor worker.

The worker starts this file with one end of a Unix stream socketpair
inherited on the fd named by TORPOR_AGENT_FD (default 3), either as a script
(`python3 -S torpor_agent.py`) or, faster, by importing it so its bytecode
comes from __pycache__ instead of being compiled on every start:

    python3 -S -c "import sys;sys.path.insert(0,sys.argv[1]);import torpor_agent;torpor_agent.main()" DIR

It speaks the agent protocol on the socket: length-prefixed frames of
JSON header + raw body, specified in docs/agent-protocol.md. The agent owns
only the Python side of that contract: importing the user's module, calling
the handler, and capturing everything the process writes to fd 1 and 2.
Scheduling, timeouts, limits and killing are the worker's job.

Start-up time matters (it is on every cold start), so this file imports
nothing at module level but os and sys, sends `hello` before anything else,
and never imports the `json` package (which drags in re and enum, ~8 ms on a
slow machine): it drives the C accelerator `_json` directly and falls back to
`json` only if that ever stops working. `traceback` is imported on the first
error only.
"""

import os
import sys

PROTOCOL_VERSION = 1
MAX_HEADER = 1 << 20  # bytes; a larger frame is a protocol error
MAX_BODY = 16 << 20
AGENT_FILE = __file__
# Frames of this file are hidden from user tracebacks. Compare against the
# code's own filename: __file__ differs when run from a .pyc.
_CODE_FILE = (lambda: None).__code__.co_filename
LOG_CHUNK = 65536
DRAIN_LIMIT = 1 << 20  # bytes per pipe per drain
MAX_ERROR_MESSAGE = 64 << 10  # characters; keeps an error header under MAX_HEADER
MAX_TRACE_LINES = 100

# Message types the protocol reserves for later versions; this agent answers
# them with Protocol.NotSupported.
RESERVED = ("fork",)

_fd = -1  # the protocol socket
_diag = 2  # fd for the agent's own diagnostics (the process's original stderr)
_rbuf = b""  # bytes read from the socket but not yet parsed
_wlock = None  # serialises every socket write (main thread and log pump)
_plock = None  # held while reading a capture pipe and sending what was read
_pipes = ()  # ((read fd, "stdout"), (read fd, "stderr"))
_pipe_names = {}  # read fd -> stream name
_drain_poll = None  # select.poll over the pipes, for _drain
_call_id = ""  # the call whose output the pipes currently carry
_trace_set = False  # _X_AMZN_TRACE_ID is set from the previous call
_in_child = False  # set in a process forked from the agent
_ctl_gen = 0  # bumped whenever the control socket is replaced (checkpoints)
_swap_lock = None  # held while the control socket is being replaced
_wake_r = _wake_w = -1  # a pipe that wakes the log thread when the socket is replaced
_checkpoint_wall = 0.0  # wall clock when the last checkpoint was prepared
_loads = None
_dumps = None
_qstr = None

# Set by init.
_cfg = None
_handler = None
_init_fault = None


class _ProtocolError(Exception):
    pass


class _Fault(Exception):
    """A Lambda-shaped error: errorType, errorMessage, stackTrace."""

    def __init__(self, etype, msg, trace=None):
        Exception.__init__(self, msg)
        self.etype = etype
        self.msg = msg
        self.trace = trace or []

    def as_dict(self):
        msg, trace = self.msg, self.trace
        if len(msg) > MAX_ERROR_MESSAGE:
            msg = msg[:MAX_ERROR_MESSAGE] + "... [truncated %d characters]" % (len(msg) - MAX_ERROR_MESSAGE)
        if len(trace) > MAX_TRACE_LINES:  # keep the outermost and the innermost frames
            half = MAX_TRACE_LINES // 2
            trace = trace[:half] + ["  ... %d frames omitted ...\n" % (len(trace) - 2 * half)] + trace[-half:]
        trace = [t if len(t) <= 4096 else t[:4096] + "...\n" for t in trace]
        return {"errorMessage": msg, "errorType": self.etype[:256], "stackTrace": trace}


# ---------------------------------------------------------------- socket I/O


def _write_all(bufs):
    total = 0
    for b in bufs:
        total += len(b)
    n = os.writev(_fd, bufs)
    if n == total:
        return
    rest = memoryview(b"".join(bufs))[n:]  # partial write: rare, keep it simple
    while rest:
        rest = rest[os.write(_fd, rest):]


def _send(header, body=b""):
    """Send one frame. header is a dict; body is bytes-like."""
    _send_raw(_dumps(header).encode("utf-8"), body)


def _send_raw(h, body=b""):
    """Send one frame whose header is already encoded JSON."""
    prefix = len(h).to_bytes(4, "big") + len(body).to_bytes(4, "big")
    if _in_child:  # a fork of the agent must never speak on the worker's socket
        os._exit(0)
    with _wlock:
        try:
            if body:
                _write_all([prefix + h, body])
            else:
                _write_all([prefix + h])
        except OSError:
            # The worker is gone; nothing is left to serve.
            os._exit(0)


def _read_frame():
    """Read one frame; returns (header dict, body memoryview/bytes)."""
    global _rbuf
    buf = _rbuf
    while len(buf) < 8:
        more = os.read(_fd, 65536)
        if not more:
            raise EOFError
        buf += more
    hlen = int.from_bytes(buf[0:4], "big")
    blen = int.from_bytes(buf[4:8], "big")
    if hlen > MAX_HEADER:
        raise _ProtocolError("frame header is %d bytes, over the %d-byte limit" % (hlen, MAX_HEADER))
    if blen > MAX_BODY:
        raise _ProtocolError("frame body is %d bytes, over the %d-byte limit" % (blen, MAX_BODY))
    end = 8 + hlen + blen
    if len(buf) >= end:
        _rbuf = buf[end:]
        view = buf
    else:
        # Read the rest straight into one buffer of the exact size: no
        # over-read, no joins, one copy for multi-MB events.
        _rbuf = b""
        whole = bytearray(end)
        whole[: len(buf)] = buf
        view = memoryview(whole)
        pos = len(buf)
        while pos < end:
            n = os.readv(_fd, [view[pos:]])
            if n == 0:
                raise EOFError
            pos += n
    try:
        header = _loads(str(view[8 : 8 + hlen], "utf-8"))
    except ValueError as e:
        raise _ProtocolError("frame header is not valid JSON: %s" % e)
    if type(header) is not dict or type(header.get("type")) is not str:
        raise _ProtocolError("frame header is not a JSON object with a string \"type\"")
    return header, view[8 + hlen : end]


# ----------------------------------------------------------- output capture


def _send_log(stream, data):
    _send_raw(('{"type":"log","id":%s,"stream":"%s"}' % (_qstr(_call_id), stream)).encode("utf-8"), data)


def _pump():
    try:
        _pump_loop()
    except BaseException as e:
        # Without the pump a call printing more than a pipe buffer would
        # block forever: better to die and let the worker see it.
        _diag_print("log pump failed, exiting: %r" % (e,))
        os._exit(2)


def _pump_loop():
    """Forward whatever arrives on the capture pipes as log frames.

    A chunk is read and sent under _plock, so once the main thread holds
    _plock no byte is in flight between pipe and socket: that is what lets
    _drain() promise every byte a call wrote precedes its result.
    """
    import select

    poller = select.poll()
    names = {}
    for fd, name in _pipes:
        poller.register(fd, select.POLLIN)
        names[fd] = name
    # Mask 0: report only hang-up/error. Lets a handler that never returns
    # die with the worker's end of the socket instead of outliving it.
    watched, gen = _fd, _ctl_gen
    poller.register(watched, 0)
    poller.register(_wake_r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == _wake_r or fd == watched:
                if fd == _wake_r:
                    os.read(_wake_r, 64)
                with _swap_lock:  # a checkpoint may be replacing the socket
                    pass
                if gen == _ctl_gen:
                    if fd == watched:
                        os._exit(0)  # the worker hung up
                    continue  # a wake-up for a replacement already handled
                poller.unregister(watched)
                watched, gen = _fd, _ctl_gen
                poller.register(watched, 0)
                break  # the other events of this poll may name the old socket
            with _plock:
                try:
                    data = os.read(fd, LOG_CHUNK)
                except BlockingIOError:
                    continue  # the main thread drained it first
                except OSError:
                    data = b""
                if not data:  # every writer closed the pipe, or user code closed our end
                    poller.unregister(fd)
                    del names[fd]
                    continue
                _send_log(names[fd], data)


def _flush_std():
    out, err = sys.stdout, sys.stderr
    for s in (out, err) if out is sys.__stdout__ and err is sys.__stderr__ else (out, err, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except Exception:
            pass


def _drain():
    """Send everything written to fd 1/2 so far as log frames, now."""
    _flush_std()
    with _plock:
        # One poll(0) instead of a failing read per pipe: the common case
        # is a call that printed nothing.
        ready = _drain_poll.poll(0) if _drain_poll is not None else _pipes
        for fd, _ in ready:
            name = _pipe_names[fd]
            # Whatever was written before the flush is at most a pipe
            # buffer; the bound only stops a background writer from
            # holding the result back forever.
            left = DRAIN_LIMIT
            while left > 0:
                try:
                    data = os.read(fd, LOG_CHUNK)
                except OSError:  # BlockingIOError: pipe is empty
                    break
                if not data:
                    break
                _send_log(name, data)
                left -= len(data)


def _setup_drain_poll():
    global _drain_poll
    import select

    p = select.poll()
    for fd, _ in _pipes:
        p.register(fd, select.POLLIN)
    _drain_poll = p


def _capture_std():
    """Point fd 1 and 2 at pipes so output of C code and children is captured."""
    global _pipes, _diag
    for n in (0, 1, 2):  # never let a pipe land on a closed standard fd
        try:
            os.fstat(n)
        except OSError:
            os.open(os.devnull, os.O_RDWR)
    _flush_std()
    _diag = os.dup(2)
    pipes = []
    for target, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, target)  # inheritable: children write to the pipe too
        os.close(w)
        os.set_blocking(r, False)
        pipes.append((r, name))
    _pipes = tuple(pipes)
    _pipe_names.update(pipes)
    if sys.stdout is None:
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
    if sys.stderr is None:
        sys.stderr = sys.__stderr__ = open(2, "w", closefd=False)
    try:
        # Lambda's runtime writes stdout unbuffered; line buffering keeps a
        # print's bytes in order with what child processes write to fd 1.
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:
        pass


def _diag_print(msg):
    try:
        os.write(_diag, ("torpor-agent: %s\n" % msg).encode("utf-8", "replace"))
    except OSError:
        pass


# --------------------------------------------------------------------- JSON


def _json_default(o):
    # Lambda's Python runtime serialises Decimal as a number.
    t = type(o)
    if t.__name__ == "Decimal" and t.__module__ == "decimal":
        return float(o)
    raise TypeError("Object of type %s is not JSON serializable" % o.__class__.__name__)


def _setup_json():
    """Set _loads, _dumps (json.loads / json.dumps(ensure_ascii=False)) and _qstr (a str as JSON)."""
    global _loads, _dumps, _qstr
    try:
        import _json

        class _Ctx:
            pass

        ctx = _Ctx()
        ctx.strict = True
        ctx.object_hook = None
        ctx.object_pairs_hook = None
        ctx.parse_float = float
        ctx.parse_int = int
        ctx.parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
        ctx.memo = {}
        scan = _json.make_scanner(ctx)
        make_encoder = _json.make_encoder
        encode_str = _json.encode_basestring
        ws = " \t\n\r"

        def loads(s):
            i = len(s) - len(s.lstrip(ws))
            try:
                obj, end = scan(s, i)
            except StopIteration as e:
                raise ValueError("Expecting value: char %d" % e.value)
            if end != len(s) and s[end:].strip(ws):
                raise ValueError("Extra data: char %d" % end)
            return obj

        def dumps(o):
            enc = make_encoder({}, _json_default, encode_str, None, ": ", ", ", False, False, True)
            return "".join(enc(o, 0))

        # Guard against a Python whose private _json signatures drifted.
        probe = '{"a": [1, 2.5, null, true, "\u00e9\\n"], "b": {}}'
        if dumps(loads(probe)) != probe:
            raise ValueError("_json round trip mismatch")
        _loads, _dumps, _qstr = loads, dumps, encode_str
    except Exception:
        import json

        _loads = json.loads
        _dumps = json.JSONEncoder(ensure_ascii=False, default=_json_default).encode
        _qstr = json.encoder.encode_basestring


# ------------------------------------------------------------ errors, traces


def _frames(tb, skip_importlib):
    import traceback

    out = []
    for f in traceback.extract_tb(tb):
        if f.filename == _CODE_FILE:
            continue
        if skip_importlib and f.filename.startswith("<frozen importlib"):
            continue
        out.append((f.filename, f.lineno, f.name, f.line))
    # Tuples, as Lambda's runtime does: format_list then prints no carets.
    return traceback.format_list(out)


def _exc_message(e):
    try:
        return str(e)
    except Exception:
        return "<exception str() failed>"


def _fault_from(e, skip_importlib=False):
    return _Fault(type(e).__name__, _exc_message(e), _frames(e.__traceback__, skip_importlib))


# -------------------------------------------------------------- init/invoke


def _load_handler(spec):
    """Import the handler's module and return the handler (Lambda's rules)."""
    try:
        modname, fname = spec.rsplit(".", 1)
    except ValueError as e:
        raise _Fault("Runtime.MalformedHandlerName", "Bad handler '%s': %s" % (spec, e))
    modname = modname.replace("/", ".")
    if modname.split(".")[0] in sys.builtin_module_names:
        raise _Fault("Runtime.BuiltInModuleConflict", "Cannot use built-in module %s as a handler module" % modname)
    try:
        __import__(modname)
        mod = sys.modules[modname]
    except ImportError as e:
        raise _Fault(
            "Runtime.ImportModuleError",
            "Unable to import module '%s': %s" % (modname, _exc_message(e)),
            _frames(e.__traceback__, True),
        )
    except SyntaxError as e:
        import traceback

        # User frames that led to the import, then the location and caret.
        trace = _frames(e.__traceback__, True) + traceback.format_exception_only(type(e), e)[:-1]
        raise _Fault("Runtime.UserCodeSyntaxError", "Syntax error in module '%s': %s" % (modname, _exc_message(e)), trace)
    except SystemExit:
        raise
    except BaseException as e:
        raise _fault_from(e, True)
    try:
        return getattr(mod, fname)
    except AttributeError:
        raise _Fault("Runtime.HandlerNotFound", "Handler '%s' missing on module '%s'" % (fname, modname))


class _Config:
    __slots__ = ("function", "version", "memory", "timeout_ms", "arn", "log_group", "log_stream")


def _on_init(h):
    global _cfg, _handler, _init_fault
    t0 = _perf()
    if _cfg is not None:
        _send({"type": "init-error", "error": _Fault("Protocol.InvalidState", "agent already initialised: start a new instance for a new init").as_dict()})
        return
    cfg = _cfg = _Config()
    cfg.function = h.get("function") or ""
    version = h.get("version") or 0
    cfg.version = str(version) if version else "$LATEST"
    cfg.memory = str(h.get("memory_mb") or 128)
    cfg.timeout_ms = h.get("timeout_ms") or 3000
    cfg.arn = h.get("arn") or ""
    cfg.log_group = h.get("log_group") or "/aws/lambda/" + cfg.function
    cfg.log_stream = h.get("log_stream") or "%s/[%s]%s" % (_time.strftime("%Y/%m/%d"), cfg.version, os.urandom(16).hex())
    code_dir = h.get("code_dir") or "/var/task"
    spec = h.get("handler") or ""
    env = os.environ
    for k, v in (
        ("LAMBDA_TASK_ROOT", code_dir),
        ("_HANDLER", spec),
        ("AWS_LAMBDA_FUNCTION_NAME", cfg.function),
        ("AWS_LAMBDA_FUNCTION_VERSION", cfg.version),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", cfg.memory),
        ("AWS_LAMBDA_LOG_GROUP_NAME", cfg.log_group),
        ("AWS_LAMBDA_LOG_STREAM_NAME", cfg.log_stream),
    ):
        if k not in env:
            env[k] = v
    # The user's code comes first; the agent's own directory is not theirs.
    agent_dir = os.path.dirname(os.path.abspath(AGENT_FILE))
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != agent_dir]
    sys.path.insert(0, code_dir)
    try:
        os.chdir(code_dir)
    except OSError:
        pass
    try:
        _handler = _load_handler(spec)
    except _Fault as f:
        _init_fault = f
    except SystemExit as e:
        _exit_now(e)
    except BaseException as e:
        _init_fault = _fault_from(e, True)
    _drain()
    if _init_fault is not None:
        _send({"type": "init-error", "error": _init_fault.as_dict()})
    else:
        _send({"type": "ready", "init_ms": round((_perf() - t0) * 1000.0, 3)})


class LambdaContext:
    """The context object handed to handlers, shaped like Lambda's."""

    __slots__ = (
        "aws_request_id",
        "function_name",
        "function_version",
        "memory_limit_in_mb",
        "invoked_function_arn",
        "log_group_name",
        "log_stream_name",
        "identity",
        "client_context",
        "_deadline_ms",
    )

    def __init__(self, call_id, deadline_ms, cfg):
        self.aws_request_id = call_id
        self.function_name = cfg.function
        self.function_version = cfg.version
        self.memory_limit_in_mb = cfg.memory
        self.invoked_function_arn = cfg.arn
        self.log_group_name = cfg.log_group
        self.log_stream_name = cfg.log_stream
        self.identity = None
        self.client_context = None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self):
        return max(int(self._deadline_ms - _time.time() * 1000.0), 0)

    def log(self, msg):
        sys.stdout.write(str(msg))


def _exit_now(e):
    """sys.exit() in user code ends the instance, as on Lambda."""
    code = e.code
    if _in_child:
        os._exit(0 if code is None else code if type(code) is int else 1)
    _drain()
    if code is None:
        code = 0
    elif type(code) is not int:
        try:
            sys.stderr.write(str(code) + "\n")
            _drain()
        except Exception:
            pass
        code = 1
    os._exit(code)


def _set_trace(trace_id):
    global _trace_set
    if trace_id:
        os.environ["_X_AMZN_TRACE_ID"] = trace_id
    else:
        os.environ.pop("_X_AMZN_TRACE_ID", None)
    _trace_set = bool(trace_id)


def _on_invoke(h, body):
    global _call_id
    cid = h.get("id") or ""
    if _handler is None:
        f = _init_fault or _Fault("Protocol.InvalidState", "invoke before init: send init and wait for ready first")
        _send({"type": "error", "id": cid, "error": f.as_dict()})
        return
    deadline = h.get("deadline_ms") or (_time.time() * 1000.0 + _cfg.timeout_ms)
    trace_id = h.get("trace_id")
    if trace_id or _trace_set:
        _set_trace(trace_id)
    fault = None
    out = b""
    _call_id = cid
    try:
        event = _loads(str(body, "utf-8")) if len(body) else {}
    except ValueError as e:
        fault = _Fault("Runtime.UnmarshalError", "Unable to unmarshal input: %s" % _exc_message(e))
    if fault is None:
        try:
            result = _handler(event, LambdaContext(cid, deadline, _cfg))
        except SystemExit as e:
            _exit_now(e)
        except BaseException as e:
            fault = _fault_from(e)
        else:
            try:
                out = _dumps(result).encode("utf-8")
            except Exception as e:
                fault = _Fault("Runtime.MarshalError", "Unable to marshal response: %s" % _exc_message(e))
            else:
                if len(out) > MAX_BODY:
                    fault = _Fault(
                        "Function.ResponseSizeTooLarge",
                        "Response payload size (%d bytes) exceeded the agent protocol's maximum (%d bytes)" % (len(out), MAX_BODY),
                    )
        result = None
    if _in_child:  # a fork of the agent returned from the handler
        os._exit(0)
    _drain()
    _call_id = ""
    if fault is None:
        _send_raw(('{"type":"result","id":%s}' % _qstr(cid)).encode("utf-8"), out)
    else:
        _send({"type": "error", "id": cid, "error": fault.as_dict()})


def _statm_rss():
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _on_prepare_checkpoint(h):
    """Make the process worth dumping, then hand the control socket over.

    The worker's socket belongs to the worker's network namespace, which a
    checkpoint cannot capture. So the agent listens on a Unix socket at the
    path the worker names (inside the instance's own /tmp, which the
    snapshot captures), replies, closes the worker's socket and waits for a
    connection there: from the worker after a dump that left the instance
    running, or from whichever worker restored the snapshot.
    """
    global _ctl_gen, _checkpoint_wall
    import gc
    import socket

    cid = h.get("id") or ""
    path = h.get("listen")
    if type(path) is not str or not path.startswith("/") or len(path) > 100:
        f = _Fault("Protocol.InvalidMessage", "prepare-checkpoint needs \"listen\", an absolute socket path of at most 100 bytes")
        _send({"type": "error", "id": cid, "error": f.as_dict()})
        return
    t0 = _perf()
    rss_before = _statm_rss()
    if h.get("gc", True):
        # CheckSync's observation: the runtime knows which memory is live.
        # Freed objects and the allocator's free lists are not worth
        # capturing; collect and give them back to the kernel first.
        gc.collect()
        try:
            import ctypes

            ctypes.CDLL(None).malloc_trim(0)
        except Exception:
            pass  # not glibc, or no ctypes: the dump is just larger
    rss_after = _statm_rss()
    _drain()
    d = os.path.dirname(path)
    try:
        os.makedirs(d, 0o700, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        lsk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsk.bind(path)
        lsk.listen(1)
    except OSError as e:
        f = _Fault("Runtime.CheckpointError", "cannot listen on %s for the restored control socket: %s" % (path, e))
        _send({"type": "error", "id": cid, "error": f.as_dict()})
        return
    _swap_lock.acquire()
    try:
        _checkpoint_wall = _time.time()
        _send({"type": "checkpoint-ready", "id": cid, "rss_before": rss_before, "rss_after": rss_after,
               "gc_ms": (_perf() - t0) * 1000.0})
        with _wlock:
            old = _fd
            # The log thread polls this socket and so holds a reference to
            # it: close our descriptor, then wake the thread so that it lets
            # go. Only then does the worker see EOF, which is how it knows
            # the socket is gone from this process before it dumps it.
            os.close(old)
            os.write(_wake_w, b"x")
            conn, _ = lsk.accept()
            newfd = conn.detach()
            if newfd != old:  # keep the socket on the fd number it had
                os.dup2(newfd, old, inheritable=False)
                os.close(newfd)
            lsk.close()
            try:
                os.unlink(path)
                os.rmdir(d)
            except OSError:
                pass
            _ctl_gen += 1
    finally:
        _swap_lock.release()


def _on_after_restore(h):
    """First message on a replaced control socket."""
    cid = h.get("id") or ""
    jump_ms = (_time.time() - _checkpoint_wall) * 1000.0 if _checkpoint_wall else 0.0
    if h.get("restored"):
        # A restored snapshot may run many times: a generator seeded before
        # the checkpoint would repeat the same "random" numbers in each.
        for name in ("random",):
            m = sys.modules.get(name)
            if m is not None:
                try:
                    m.seed()
                except Exception:
                    pass
    _send({"type": "resumed", "id": cid, "clock_jump_ms": jump_ms, "pid": os.getpid()})


def _dispatch(h, body):
    t = h["type"]
    if t == "invoke":
        _on_invoke(h, body)
    elif t == "prepare-checkpoint":
        _on_prepare_checkpoint(h)
    elif t == "after-restore":
        _on_after_restore(h)
    elif t == "ping":
        _send({"type": "pong", "id": h.get("id") or ""})
    elif t == "init":
        _on_init(h)
    elif t in RESERVED:
        f = _Fault("Protocol.NotSupported", "%s is not supported by the python agent (protocol v%d)" % (t, PROTOCOL_VERSION))
        _send({"type": "error", "id": h.get("id") or "", "error": f.as_dict()})
    else:
        f = _Fault("Protocol.UnknownMessage", "unknown message type %r (python agent, protocol v%d)" % (t, PROTOCOL_VERSION))
        _send({"type": "error", "id": h.get("id") or "", "error": f.as_dict()})


def _after_fork_in_child():
    global _in_child
    _in_child = True
    try:
        os.close(_fd)  # a fork must never speak on the worker's socket
    except OSError:
        pass


def _reap():
    """Collect exited children after a call. A handler's own subprocess
    objects cope: subprocess treats an already-reaped child as exited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    global _fd, _wlock, _plock, _swap_lock, _wake_r, _wake_w, _time, _perf
    import _thread
    import time as _time

    _perf = _time.perf_counter
    _fd = int(os.environ.pop("TORPOR_AGENT_FD", "3"))
    sys.argv[:] = [AGENT_FILE]  # not the bootstrap's -c arguments
    os.set_inheritable(_fd, False)  # exec'd children must not keep the worker's socket open
    _wlock = _thread.allocate_lock()
    _plock = _thread.allocate_lock()
    _swap_lock = _thread.allocate_lock()
    _capture_std()
    _wake_r, _wake_w = os.pipe()
    hello = '{"type":"hello","v":%d,"runtime":"python%d.%d.%d","pid":%d}' % (
        (PROTOCOL_VERSION,) + tuple(sys.version_info[:3]) + (os.getpid(),)
    )
    hello = hello.encode()
    try:
        _write_all([len(hello).to_bytes(4, "big") + bytes(4) + hello])
    except OSError as e:
        _diag_print("cannot send hello on fd %d: %s" % (_fd, e))
        os._exit(2)
    # Everything below overlaps with the worker preparing init.
    _setup_json()
    _setup_drain_poll()
    _thread.start_new_thread(_pump, ())
    os.register_at_fork(after_in_child=_after_fork_in_child)
    # As pid 1 of its sandbox the agent inherits every orphaned process;
    # unreaped, their zombies would use up the instance's pids limit.
    reaper = os.getpid() == 1
    while True:
        try:
            h, body = _read_frame()
        except EOFError:
            os._exit(0)
        except _ProtocolError as e:
            _diag_print("protocol error, exiting: %s" % e)
            os._exit(2)
        except ConnectionResetError:
            os._exit(0)  # the worker closed with unread data: same as EOF
        except OSError as e:
            _diag_print("reading the worker socket: %s" % e)
            os._exit(0 if _in_child else 2)
        try:
            _dispatch(h, body)
        except Exception as e:  # an agent bug: answer, don't hang the call
            _diag_print("internal error handling %r: %r" % (h.get("type"), e))
            f = _Fault("Runtime.AgentError", "torpor agent internal error: %s" % _exc_message(e))
            _send({"type": "error", "id": h.get("id") or "", "error": f.as_dict()})
        if reaper:
            _reap()


_time = None
_perf = None

if __name__ == "__main__":
    main()
