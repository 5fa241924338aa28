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
_in_handler = False  # the user's handler is running (a mid-call checkpoint may hand it over)
_ckpt_listen = None  # the running call's checkpoint_listen path, if it may be checkpointed
_role = "instance"  # or "runtime-template", "function-template" (see the templates section)
_template_fork = False  # set around os.fork() calls of a template: its children are not plain forks
_status_fd = -1  # templates: where exits of their children are reported
_pump_stop = False  # asks the log thread to return (a function template before it forks)
_pump_done = None  # lock the log thread holds while it runs
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
    finally:
        _pump_done.release()  # acquired for it by _start_pump


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
                    if _pump_stop:
                        return
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
    global _call_id, _in_handler, _ckpt_listen
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
    _ckpt_listen = h.get("checkpoint_listen")
    try:
        event = _loads(str(body, "utf-8")) if len(body) else {}
    except ValueError as e:
        fault = _Fault("Runtime.UnmarshalError", "Unable to unmarshal input: %s" % _exc_message(e))
    if fault is None:
        try:
            _in_handler = True
            try:
                result = _handler(event, LambdaContext(cid, deadline, _cfg))
            finally:
                _in_handler = False
                _ckpt_listen = None
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
    import gc

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
    try:
        lsk = _listen(path)
    except OSError as e:
        f = _Fault("Runtime.CheckpointError", "cannot listen on %s for the restored control socket: %s" % (path, e))
        _send({"type": "error", "id": cid, "error": f.as_dict()})
        return
    _hand_over(lsk, path, {"type": "checkpoint-ready", "id": cid, "rss_before": rss_before, "rss_after": rss_after,
                           "gc_ms": (_perf() - t0) * 1000.0})


def _listen(path):
    """Listen on the Unix socket path (replacing a stale one) for the next control connection."""
    import socket

    os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    lsk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lsk.bind(path)
        lsk.listen(1)
    except OSError:
        lsk.close()
        raise
    return lsk


def _hand_over(lsk, path, ready):
    """Send ready, let go of the worker's socket and wait on lsk for the
    next worker: the one that restores this process, or the same one
    after a dump that left it running. Returns once connected."""
    global _ctl_gen, _checkpoint_wall, _rbuf
    _swap_lock.acquire()
    try:
        _checkpoint_wall = _time.time()
        _send(ready)
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
                os.rmdir(os.path.dirname(path))
            except OSError:
                pass
            _rbuf = b""
            _ctl_gen += 1
    finally:
        _swap_lock.release()


def _foreign_sockets():
    """Why this process cannot be dumped now: the sockets it holds besides
    the worker's ("" if none). A connection in flight (an HTTP request to
    another service, say) cannot move with the process; the worker asks
    again a moment later, when the request is done."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        if name == str(_fd):
            continue
        try:
            if os.readlink("/proc/self/fd/" + name).startswith("socket:"):
                n += 1
        except OSError:
            pass
    return "the call holds %d open socket(s)" % n if n else ""


def _on_checkpoint_signal(signum, frame):
    """CheckpointSignal: hand the running call over for a checkpoint.

    Python runs this in the main thread between two bytecodes of the
    handler (or when a blocking call is interrupted), so the handler's
    state is whole. The agent answers checkpoint-ready, gives up its socket
    and blocks here until the restoring worker connects; the dump freezes it
    right here, and the restored process returns from this function into
    the handler, whose result then goes to the new worker."""
    global _ckpt_listen
    if not _in_handler or not _ckpt_listen or _in_child:
        return  # between calls, a call that may not move, or a hand-over in progress (a signal repeated)
    cid, path = _call_id, _ckpt_listen
    _ckpt_listen = None  # until the hand-over is over: the worker keeps signalling meanwhile
    why = _foreign_sockets()
    lsk = None
    if not why:
        try:
            lsk = _listen(path)
        except OSError as e:
            why = "cannot listen on %s: %s" % (path, e)
    if lsk is None:
        _ckpt_listen = path
        _send({"type": "checkpoint-deferred", "id": cid, "reason": why})
        return
    try:
        # What the handler printed so far goes to this worker, with this
        # hop's log: after the restore the new worker would get it before
        # it hears the process is back, and could not place it.
        _drain()
        _hand_over(lsk, path, {"type": "checkpoint-ready", "id": cid, "in_call": cid, "rss_after": _statm_rss()})
        try:
            h, _ = _read_frame()
        except (EOFError, OSError, _ProtocolError):
            os._exit(0)  # the new worker hung up before it said hello: nothing to serve
        if h.get("type") != "after-restore":
            _diag_print("expected after-restore on the new control socket, got %r" % (h.get("type"),))
            os._exit(2)
        # No reseed: a process moved in the middle of a call runs on exactly
        # once, and its handler keeps the random stream it had.
        _send({"type": "resumed", "id": h.get("id") or "", "clock_jump_ms": (_time.time() - _checkpoint_wall) * 1000.0,
               "pid": os.getpid(), "in_call": cid})
    finally:
        _ckpt_listen = path  # the call may move again (a failed dump, a later slice)


def _on_after_restore(h):
    """First message on a replaced control socket."""
    cid = h.get("id") or ""
    jump_ms = (_time.time() - _checkpoint_wall) * 1000.0 if _checkpoint_wall else 0.0
    if h.get("restored"):
        # A restored snapshot may run many times: a generator seeded before
        # the checkpoint would repeat the same "random" numbers in each.
        _reseed()
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
    elif t in ("fork", "fork-template"):
        f = _Fault("Protocol.InvalidState", "%s goes to a template; this process is a function instance" % t)
        _send({"type": "error", "id": h.get("id") or "", "error": f.as_dict()})
    else:
        f = _Fault("Protocol.UnknownMessage", "unknown message type %r (python agent, protocol v%d)" % (t, PROTOCOL_VERSION))
        _send({"type": "error", "id": h.get("id") or "", "error": f.as_dict()})


def _after_fork_in_child():
    global _in_child
    if _template_fork:
        return  # a template's own fork: the child sets itself up
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


def _hello(extra=""):
    """Send hello: raw bytes, before the JSON helpers exist."""
    hello = '{"type":"hello","v":%d,"runtime":"python%d.%d.%d","pid":%d%s}' % (
        (PROTOCOL_VERSION,) + tuple(sys.version_info[:3]) + (os.getpid(), extra)
    )
    hello = hello.encode()
    try:
        _write_all([len(hello).to_bytes(4, "big") + bytes(4) + hello])
    except OSError as e:
        _diag_print("cannot send hello on fd %d: %s" % (_fd, e))
        os._exit(2)


def _start_pump():
    global _wake_r, _wake_w, _pump_stop
    import _thread

    _pump_stop = False
    _wake_r, _wake_w = os.pipe()
    _setup_drain_poll()
    _pump_done.acquire()
    _thread.start_new_thread(_pump, ())


def main():
    global _fd, _wlock, _plock, _swap_lock, _pump_done, _time, _perf, _role
    import _thread
    import time as _time

    _perf = _time.perf_counter
    _fd = int(os.environ.pop("TORPOR_AGENT_FD", "3"))
    _role = os.environ.pop("TORPOR_ROLE", "") or "instance"
    sys.argv[:] = [AGENT_FILE]  # not the bootstrap's -c arguments
    os.set_inheritable(_fd, False)  # exec'd children must not keep the worker's socket open
    _wlock = _thread.allocate_lock()
    _plock = _thread.allocate_lock()
    _swap_lock = _thread.allocate_lock()
    _pump_done = _thread.allocate_lock()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    import _signal  # the C module: signal.py would import enum

    _signal.signal(_signal.SIGUSR2, _on_checkpoint_signal)  # agentproto.CheckpointSignal
    if _role == "runtime-template":
        _runtime_template_main()  # never returns
    _capture_std()
    _hello()
    # Everything below overlaps with the worker preparing init.
    _setup_json()
    _start_pump()
    # As pid 1 of its sandbox the agent inherits every orphaned process;
    # unreaped, their zombies would use up the instance's pids limit.
    _serve(os.getpid() == 1)


def _serve(reaper):
    """Answer the worker's requests until it hangs up."""
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
        if _role == "function-template" and _handler is not None:
            _function_template_main()  # code loaded: from now on only forks; never returns
        if reaper:
            _reap()


# ---------------------------------------------------------------- templates
#
# SEUSS's snapshot stack as a fork lineage (docs/templates.md):
#
#   runtime template   one per worker and runtime: this interpreter with the
#                      agent loaded and warmed, parked as a fork server. It
#                      runs as root in a sandbox of its own and never runs
#                      tenant code.
#   function template  forked from it on "fork-template": enters the
#                      function's sandbox (mount, PID, IPC, UTS and network
#                      namespaces, uid, seccomp) *before* its code is
#                      imported, imports it on "init", then only forks.
#   instance           forked from the function template on "fork": gets its
#                      own socket, reseeds its RNGs, checks it inherited no
#                      socket, and serves calls like any instance.
#
# Both kinds of template receive descriptors with their requests
# (SCM_RIGHTS) and report each child's exit on a status pipe the worker
# reads: "PID STATUS\n", PID in the template's PID namespace, STATUS the raw
# wait status.

_sock = None  # a socket object on _fd, for recvmsg (templates only)
_libc = None
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SYS_SECCOMP = 317
_SYS_MOUNT_SETATTR = 442
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)


def _c():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(ret, what):
    if ret != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _mount(src, target, fstype, flags, data=None):
    enc = lambda v: None if v is None else v.encode()
    _check(_c().mount(enc(src), enc(target), enc(fstype), flags, enc(data)), "mount %s on %s" % (src or fstype, target))


def _mount_setattr(path, attr):
    import ctypes

    buf = (ctypes.c_uint64 * 4)(attr, 0, 0, 0)  # struct mount_attr: set, clr, propagation, userns_fd
    _check(_c().syscall(_SYS_MOUNT_SETATTR, -100, path.encode(), 0, ctypes.byref(buf), 32), "mount_setattr " + path)


def _recv_frame_fds():
    """Read one frame and the descriptors sent with it (SCM_RIGHTS)."""
    global _sock
    import socket

    if _sock is None:
        _sock = socket.socket(fileno=os.dup(_fd))
    fds = []
    buf = b""
    # The descriptors ride on the frame's first byte: read the prefix with
    # recvmsg, the rest as usual (nothing is ever pipelined to a template).
    while len(buf) < 8:
        data, anc, _, _ = _sock.recvmsg(8 - len(buf), socket.CMSG_SPACE(16), socket.MSG_CMSG_CLOEXEC)
        if not data:
            raise EOFError
        buf += data
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                n = len(cdata) - len(cdata) % 4
                fds.extend(int.from_bytes(cdata[i:i + 4], sys.byteorder) for i in range(0, n, 4))
    global _rbuf
    _rbuf = buf
    h, body = _read_frame()
    return h, body, fds


_handed = set()  # children the worker was told about (forked replies)


def _report_exits(signum=None, frame=None):
    """SIGCHLD: reap every exited child and report those the worker knows
    (not pre-forked children never handed out, nor reparented orphans) on
    the status pipe."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in _handed:
            continue
        _handed.discard(pid)
        try:
            os.write(_status_fd, b"%d %d\n" % (pid, status))
        except OSError:
            pass


def _template_loop(handlers, idle=None):
    """Serve a template's requests: handlers maps a type to f(h, fds) ->
    reply. idle, when given, is (due, step): due() returns in how many ms
    background work is due (None: none), and once that long has passed with
    no request, step() does one unit of it — off the path of the requests."""
    poller = None
    if idle is not None:
        import select

        poller = select.poll()
        poller.register(_fd, select.POLLIN)
    while True:
        while poller is not None:
            wait = idle[0]()
            if wait is None or poller.poll(wait):
                break
            idle[1]()
        try:
            h, _, fds = _recv_frame_fds()
        except (EOFError, ConnectionResetError):
            os._exit(0)
        except (_ProtocolError, OSError) as e:
            _diag_print("%s: reading the worker socket: %s" % (_role, e))
            os._exit(2)
        t = h["type"]
        cid = h.get("id") or ""
        try:
            if t == "ping":
                reply = {"type": "pong"}
            elif t in handlers:
                reply = handlers[t](h, fds)
            else:
                raise _Fault("Protocol.UnknownMessage", "%s does not take %r messages" % (_role, t))
        except _Fault as f:
            reply = {"type": "error", "error": f.as_dict()}
        except Exception as e:
            reply = {"type": "error", "error": _Fault("Runtime.AgentError", "%s: %s" % (t, _exc_message(e))).as_dict()}
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        reply["id"] = cid
        _send(reply)


def _warm_up():
    """SEUSS's anticipatory optimisation: push a dummy function through the
    whole path once (import, compile, invoke, error, reply), so that every
    function template and instance forked later starts with those modules
    imported and those code paths' caches filled."""
    global _fd, _cfg, _handler
    import socket

    d = "/tmp/.torpor-warmup"
    os.makedirs(d, exist_ok=True)
    with open(d + "/torpor_warmup.py", "w") as f:
        f.write("import json\n\ndef handler(event, context):\n    if event.get('fail'):\n"
                "        raise ValueError('warm-up')\n    return {'ok': True, 'n': len(json.dumps(event))}\n")
    sys.path.insert(0, d)
    a, b = socket.socketpair()
    saved = _fd
    try:
        _fd = a.fileno()
        cfg = _cfg = _Config()
        cfg.function, cfg.version, cfg.memory, cfg.timeout_ms = "warm-up", "1", "128", 3000
        cfg.arn = cfg.log_group = cfg.log_stream = ""
        _handler = _load_handler("torpor_warmup.handler")
        for body in (b'{"x": [1, 2.5, "\u00e9"]}', b'{"fail": true}'):
            _on_invoke({"type": "invoke", "id": "warm-up"}, body)
            n = 0
            while n < 8:  # read the reply's frame off the other end
                prefix = b.recv(8, socket.MSG_PEEK)
                n = len(prefix)
            size = 8 + int.from_bytes(prefix[:4], "big") + int.from_bytes(prefix[4:8], "big")
            while size > 0:
                size -= len(b.recv(size))
    finally:
        _fd = saved
        _cfg = _handler = None
        a.close()
        b.close()
        sys.path.remove(d)
        sys.modules.pop("torpor_warmup", None)
        for name in os.listdir(d):
            if name != "__pycache__":
                os.unlink(os.path.join(d, name))
    import gc

    gc.collect()
    gc.freeze()  # what exists now is shared with every fork: keep the GC off its pages


def _runtime_template_main():
    """The runtime template: warm up, then fork function templates."""
    global _status_fd, _own_network, _spare_count
    import signal

    t0 = _perf()
    _status_fd = int(os.environ.pop("TORPOR_STATUS_FD", "4"))
    os.set_inheritable(_status_fd, False)
    _own_network = os.environ.pop("TORPOR_OWN_NETWORK", "1") == "1"
    _spare_count = int(os.environ.pop("TORPOR_SPARES", "2"))
    _setup_json()
    _warm_up()
    signal.signal(signal.SIGCHLD, _report_exits)
    _refill_spares()
    _hello(',"role":"runtime-template","warm_ms":%.3f' % ((_perf() - t0) * 1000.0))
    _template_loop({"fork-template": _on_fork_template},
                   (lambda: _IDLE_WAIT_MS if _spares_short() else None, _refill_one))


# Spare sandboxes: the namespaces of a function template cost milliseconds
# to create (a network namespace most), so the runtime template keeps a few
# made in advance — forked, unshared, with /proc and loopback up — each
# waiting on a socket of its own for the function it will become. A
# fork-template takes one; the replacement is made once no request has
# come for _IDLE_WAIT_MS, so that it does not compete for the CPU with the
# cold start that took the spare (importing, forking the first instance).
_spares = []  # [(pid, socket to it)], oldest first
_spare_count = 2
_own_network = True


def _on_fork_template(h, fds):
    """Hand a spare sandbox the function's config and descriptors (its
    socket, its status pipe): it becomes the function template. Returns the
    reply: its pid in this template's namespace."""
    cfg = h.get("config")
    if type(cfg) is not dict or len(fds) != 2:
        raise _Fault("Protocol.InvalidMessage", "fork-template needs \"config\" and two descriptors (socket, status pipe)")
    if bool(cfg.get("own_network", True)) != _own_network:
        raise _Fault("Protocol.InvalidMessage", "own_network %r differs from the runtime template's" % cfg.get("own_network"))
    import socket

    while True:
        if not _spares:
            _make_spare()
        pid, sk = _spares.pop(0)
        try:
            body = _dumps(cfg).encode("utf-8")
            socket.send_fds(sk, [len(body).to_bytes(4, "big") + body], fds)
        except OSError:
            sk.close()  # that spare died: take the next
            continue
        sk.close()
        _handed.add(pid)
        return {"type": "forked", "pid": pid}


_IDLE_WAIT_MS = 3


_spare_retry_at = 0.0  # after a failure, no new spare before this (perf_counter)


def _spares_short():
    return len(_spares) < _spare_count and _perf() >= _spare_retry_at


def _refill_one():
    global _spare_retry_at
    try:
        _make_spare()
    except (_Fault, OSError) as e:
        msg = e.as_dict().get("errorMessage") if isinstance(e, _Fault) else str(e)
        _diag_print("cannot make a spare sandbox (retrying in 5 s): %s" % msg)
        _spare_retry_at = _perf() + 5.0


def _refill_spares():
    while _spares_short():
        _refill_one()


def _make_spare():
    """Fork a spare sandbox: a child that unshares the namespaces and forks
    again; that grandchild, pid 1 of the new PID namespace, prepares what
    does not depend on the function and waits for it."""
    global _template_fork
    import socket

    mine, theirs = socket.socketpair()
    r, w = os.pipe()
    _template_fork = True
    try:
        pid = os.fork()
    except OSError:
        for x in (mine, theirs):
            x.close()
        os.close(r)
        os.close(w)
        raise
    finally:
        _template_fork = False
    if pid == 0:  # the intermediate child
        try:
            os.close(r)
            mine.close()
            flags = _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWIPC | _CLONE_NEWPID
            if _own_network:
                flags |= _CLONE_NEWNET
            _check(_c().unshare(flags), "unshare")
            _template_fork = True
            child = os.fork()
            if child == 0:
                os.close(w)
                _spare_main(theirs)  # never returns
            os.write(w, b"%d" % child)
            os._exit(0)
        except BaseException as e:
            try:
                os.write(w, ("E%s" % (e,)).encode("utf-8", "replace"))
            finally:
                os._exit(1)
    os.close(w)
    theirs.close()
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    if not out or out[:1] == b"E":
        mine.close()
        raise _Fault("Sandbox.SetupError", "cannot create a function sandbox's namespaces: %s" % out[1:].decode("utf-8", "replace"))
    _spares.append((int(out), mine))


def _spare_main(sk):
    """A spare sandbox: prepare, then wait for the function to become."""
    import signal
    import socket

    global _template_fork, _in_child
    _template_fork = _in_child = False
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        if _own_network:
            _loopback_up()
        head, fds, _, _ = socket.recv_fds(sk, 4, 2)
        if len(head) < 4:
            os._exit(0)  # the runtime template is gone
        size = int.from_bytes(head, "big")
        body = b""
        while len(body) < size:
            more = sk.recv(size - len(body))
            if not more:
                os._exit(0)
            body += more
        cfg = _loads(body.decode("utf-8"))
    except BaseException as e:
        _diag_print("spare sandbox failed: %s" % (e,))
        os._exit(126)
    sk.close()
    _become_function_template(cfg, fds)


def _become_function_template(cfg, fds):
    """In the new namespaces, as pid 1: build the function's sandbox, drop
    every privilege and serve as the function template. On failure it
    reports on the new socket and exits."""
    global _fd, _status_fd, _role, _rbuf, _sock, _template_fork, _in_child
    import signal

    _template_fork = _in_child = False
    _fd, _status_fd = fds
    _rbuf, _sock, _role = b"", None, "function-template"
    # Hello first: the worker moves this process into the template's
    # cgroup while it builds the sandbox; started says it is done.
    _hello(',"role":"function-template"')
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.set_inheritable(_fd, False)
    os.set_inheritable(_status_fd, False)
    try:
        _enter_sandbox(cfg)
    except BaseException as e:
        f = _Fault("Sandbox.SetupError", "function template sandbox: %s" % (e,))
        try:
            _send({"type": "init-error", "error": f.as_dict()})
        finally:
            os._exit(126)
    _capture_std()
    _start_pump()
    _send({"type": "started"})
    _serve(False)


def _enter_sandbox(cfg):
    """Finish the function's sandbox around this spare (root in the runtime
    template's user namespace, pid 1 of a new PID namespace, /proc and
    loopback up) and drop to its uid: the same steps as the Go sandbox init
    (internal/sandbox/init.go)."""
    import resource

    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=%dm" % int(cfg["tmp_mb"]))
    os.mkdir("/tmp/.shm", 0o1777)
    os.chmod("/tmp/.shm", 0o1777)
    code = cfg["code"]
    if "/" in code or code in ("", ".", ".."):
        raise ValueError("bad code directory %r" % code)
    # The runtime template sees every function's code under /var/task;
    # this function sees only its own there, read-only.
    _mount("/var/task/" + code, "/var/task", None, _MS_BIND | _MS_REC)
    _mount_setattr("/var/task", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = int(cfg.get("nofile") or 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    if cfg.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (int(cfg["nproc"]),) * 2)
    os.environ.clear()
    for kv in cfg.get("env") or ():
        k, _, v = kv.partition("=")
        os.environ[k] = v
    os.environ.pop("TORPOR_AGENT_FD", None)
    # Close whatever the runtime template had open: only stdio, the socket
    # and the status pipe cross into the sandbox.
    keep = {0, 1, 2, _fd, _status_fd}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.chdir("/var/task")
    _drop_privileges(int(cfg["uid"]), int(cfg["gid"]))
    prog = bytes.fromhex(cfg["seccomp"])
    _install_seccomp(prog)


def _loopback_up():
    import fcntl
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = bytearray(b"lo".ljust(40, b"\0"))
        fcntl.ioctl(s.fileno(), 0x8913, ifr)  # SIOCGIFFLAGS
        flags = int.from_bytes(ifr[16:18], sys.byteorder) | 1  # IFF_UP
        ifr[16:18] = flags.to_bytes(2, sys.byteorder)
        fcntl.ioctl(s.fileno(), 0x8914, ifr)  # SIOCSIFFLAGS
    finally:
        s.close()


def _drop_privileges(uid, gid):
    libc = _c()
    c = 0
    while libc.prctl(_PR_CAPBSET_DROP, c, 0, 0, 0) == 0:
        c += 1
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("still running as uid %d" % os.geteuid())
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _install_seccomp(prog):
    import ctypes

    if not prog or len(prog) % 8:
        raise ValueError("seccomp program is %d bytes, not a multiple of 8" % len(prog))
    buf = ctypes.create_string_buffer(prog, len(prog))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fp = _Fprog(len(prog) // 8, ctypes.addressof(buf))
    # TSYNC: every thread of the process, not just this one.
    _check(_c().syscall(_SYS_SECCOMP, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fp)), "seccomp")


def _null_stdio():
    """Point fd 1 and 2 at /dev/null (away from capture pipes nobody reads)."""
    _flush_std()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def _open_sockets(keep):
    """Descriptors of this process that are sockets, other than keep."""
    import stat

    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == keep:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                out.append(fd)
        except OSError:
            pass
    return out


def _function_template_main():
    """The function's code is loaded: stop the log thread and fork instances."""
    global _pump_stop
    import signal

    _pump_stop = True
    os.write(_wake_w, b"x")
    with _pump_done:  # the log thread has returned: no other thread of ours runs
        pass
    _drain()
    _null_stdio()  # nobody reads the capture pipes any more
    import gc

    # Everything the import made is shared with every fork: keep the
    # collector off those pages (each pass would write to them, copying
    # them into every instance). No collection first: it would delay the
    # first fork by a millisecond for the little garbage an import leaves.
    gc.freeze()
    _handed.clear()  # the runtime template's, of another PID namespace
    signal.signal(signal.SIGCHLD, _report_exits)
    _template_loop({"fork": _on_fork}, (_ready_due, _ready_step))


# A function template that keeps being asked to fork keeps its next
# instance forked in advance (SEUSS's anticipatory optimisation, one level
# down): the child has done the fork and its copy-on-write start-up and
# waits for its socket, so a warm start only hands it over. It is made once
# the template has forked twice within _READY_IDLE_S (one fork, then hot
# reuse of that instance, is the common case and needs none) and has been
# idle for _IDLE_WAIT_MS since; it is stopped once the template has gone
# _READY_IDLE_S without a fork, so that idle templates keep no extra process.
_ready = None  # (pid, socket to it)
_last_fork = -1e9
_prev_fork = -1e9  # the fork before _last_fork
_READY_IDLE_S = 10.0


def _ready_due():
    now = _perf()
    if _ready is None:
        return _IDLE_WAIT_MS if now - _prev_fork < _READY_IDLE_S else None
    return max(int((_READY_IDLE_S - (now - _last_fork)) * 1000.0), 0) + 1


def _ready_step():
    global _ready, _prev_fork
    if _ready is not None:  # unused for _READY_IDLE_S: stop it
        _ready[1].close()  # it sees EOF and exits; never reported
        _ready = None
    elif _perf() - _prev_fork < _READY_IDLE_S:
        try:
            _ready = _prefork()
        except OSError as e:  # e.g. the pids limit: forks on request will say so
            _diag_print("cannot fork in advance: %s" % e)
            _prev_fork = -1e9


def _fork_child():
    global _template_fork
    _template_fork = True
    try:
        return os.fork()
    finally:
        _template_fork = False


def _prefork():
    global _fd, _rbuf, _role
    import socket

    mine, theirs = socket.socketpair()
    try:
        pid = _fork_child()
    except OSError:
        mine.close()
        theirs.close()
        raise
    if pid == 0:
        mine.close()
        # All of an instance's start-up that needs no socket happens now,
        # ahead of the request; the check for inherited sockets too (this
        # process's descriptors are fixed from the fork on).
        inherited = _prepare_instance(_fd, theirs.fileno())
        _fd = -1
        try:
            _, fds, _, _ = socket.recv_fds(theirs, 1, 1)
        except OSError:
            fds = []
        if not fds:
            os._exit(0)  # the template let it go
        theirs.close()
        _fd, _rbuf, _role = fds[0], b"", "instance"
        _hello(',"role":"instance"')
        _start_instance(inherited)  # never returns
    theirs.close()
    return pid, mine


def _on_fork(h, fds):
    """Hand the socket sent with the request to the child forked in
    advance, or fork one now."""
    global _ready, _last_fork, _prev_fork
    import socket

    if len(fds) != 1:
        raise _Fault("Protocol.InvalidMessage", "fork needs exactly one descriptor, the instance's socket")
    _prev_fork, _last_fork = _last_fork, _perf()
    pid = 0
    if _ready is not None:
        pid, sk = _ready
        _ready = None
        try:
            socket.send_fds(sk, [b"s"], fds)
        except OSError:
            pid = 0  # it died: fork one now
        sk.close()
    if pid == 0:
        pid = _fork_child()
        if pid == 0:
            _become_instance(fds[0])  # never returns
    _handed.add(pid)
    return {"type": "forked", "pid": pid}


def _reseed():
    """New random state for a process that shares its parent's memory: a
    fork (or a restored snapshot) must not repeat its siblings' numbers."""
    for name in ("random",):
        m = sys.modules.get(name)
        if m is not None:
            try:
                m.seed()
            except Exception:
                pass
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:
            pass


def _become_instance(sock_fd):
    """In a child forked on request: say hello at once (the worker moves
    this process into its own cgroup meanwhile), set up, report started."""
    global _fd, _rbuf, _role
    template_fd = _fd
    _fd, _rbuf, _role = sock_fd, b"", "instance"
    _hello(',"role":"instance"')
    inherited = _prepare_instance(template_fd, sock_fd)
    _start_instance(inherited)


def _prepare_instance(template_fd, keep):
    """What a new instance does that needs no socket of its own: drop the
    template's descriptors (template_fd its socket), reseed, capture output.
    Returns how many sockets besides keep it inherited."""
    global _sock, _status_fd, _pipes, _template_fork, _in_child
    import signal

    _template_fork = _in_child = False
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    old = (template_fd, _status_fd, _wake_r, _wake_w, _diag) + tuple(fd for fd, _ in _pipes)
    if _sock is not None:
        try:
            _sock.close()
        except OSError:
            pass
        _sock = None
    for fd in old:
        try:
            os.close(fd)
        except OSError:
            pass
    _status_fd = -1
    _pipes = ()
    _pipe_names.clear()
    _null_stdio()
    _reseed()
    _capture_std()
    return len(_open_sockets(keep))


def _start_instance(inherited):
    """Report started on the instance's socket (_fd), then serve calls."""
    os.set_inheritable(_fd, False)
    _send({"type": "started", "inherited_sockets": inherited})
    if inherited:
        os._exit(3)  # the worker reads the count and retires the template
    _start_pump()
    _serve(False)


_time = None
_perf = None

if __name__ == "__main__":
    main()
