# gpupass: a gang rank's link measurement in the command's own Python
# (executor.LinkStep.InCommand). Run as `PYTHON [FLAGS] -c THIS MEASUREMENT
# OUT PORT BYTES ITERATIONS TIMEOUT -- SCRIPT ARGS...` (or `-- -m MODULE
# ARGS...`), it runs the script as `PYTHON [FLAGS] SCRIPT ARGS...` would,
# and measures the link once the script's own `import torch` has
# finished: in a process forked from the command at that moment, so that
# torch is imported once per rank, by the command, when and as the command
# imports it (a variable the script sets before its import is seen by
# torch), and nothing the measurement does (CUDA, its process group,
# its sockets) is left in the command's process. The command goes on
# when the measurement has ended, measured or not; its result is written
# as the step's is (OUT, OUT.err).
#
# Python 2 must be able to read this far without a syntax error: it then
# runs the script without a measurement.
import os, sys

_a = sys.argv
_src, _out, _port, _args, _target = _a[1], _a[2], _a[3], _a[4:7], _a[8:]
_done = []
# Only the command's own process measures (and says it did not): a
# process it forks inherits this module's hook and exit handler.
_pid = os.getpid()


def _gpupass_note(why):
    # The step's way of saying why there is no result: an empty OUT and
    # the reason as the last line of OUT.err.
    try:
        with open(_out + ".err", "a") as f:
            f.write("gpupass: " + why + "\n")
        open(_out, "a").close()
    except Exception:
        pass


def _gpupass_link():
    if _done or os.getpid() != _pid:
        return
    _done.append(1)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    import warnings
    with warnings.catch_warnings():
        # 3.12 warns of a fork in a process with threads: the child only
        # runs the measurement, which starts threads of its own.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # The command's own handlers (a script may set one before
            # its import of torch) are not the measurement's.
            import signal
            for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT"):
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDWR)
            err = os.open(_out + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(err, 2)
            if _port:
                os.environ["MASTER_PORT"] = _port
            sys.argv = ["gpupass-link"] + _args + [_out]
            exec(compile(_src, "gpupass-allreduce.py", "exec"), {"__name__": "__gpupass_link__", "GPUPASS_IN_COMMAND": True})
            code = 0
        except SystemExit as e:
            code = 0 if e.code in (None, 0) else 1
            if code:
                sys.stderr.write("%s\n" % (e.code,))
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            try:
                sys.stderr.flush()
            except Exception:
                pass
            os._exit(code)
    os.waitpid(pid, 0)
    if not os.path.exists(_out):
        open(_out, "a").close()


if sys.version_info < (3, 4):
    _gpupass_note("not measured: the command's Python is %d.%d" % sys.version_info[:2])
else:
    import importlib.util
    import atexit

    class _GpupassAfterTorch(object):
        # A finder that steps aside at the first import of torch, after
        # wrapping its loader: the measurement runs once torch's own
        # module has run.
        def find_spec(self, name, path=None, target=None):
            if name != "torch" or os.getpid() != _pid:
                return None
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    _gpupass_link()
                spec.loader.exec_module = exec_module
            return spec

    def _gpupass_never():
        if not _done and os.getpid() == _pid:
            _gpupass_note("not measured: the command ended without importing torch (the link is measured when it does)")

    if "torch" in sys.modules:
        # Imported already (by a site hook of the command's Python).
        _gpupass_link()
    else:
        sys.meta_path.insert(0, _GpupassAfterTorch())
    atexit.register(_gpupass_never)

import runpy

if _target[0] == "-m":
    # As `python -m`: the current directory first on the path.
    sys.argv = ["-m"] + _target[2:]
    if sys.path and sys.path[0] == "":
        sys.path[0] = os.getcwd()
    del _a
    runpy.run_module(_target[1], run_name="__main__", alter_sys=True)
else:
    # As `python SCRIPT`: the script's own directory first on the path.
    sys.argv = _target
    if sys.path and sys.path[0] == "":
        sys.path[0] = os.path.dirname(os.path.realpath(_target[0]))
    del _a
    runpy.run_path(_target[0], run_name="__main__")
