"""The process that serves ``lmdepth explore``'s page (:mod:`lmdepth.book.explore_app`): how it is started and
stopped, and who removes its temporary folder (the notebook, the page template and Voilà's connection files).

* :func:`run` (in ``lmdepth explore``) starts the server in a session of its own and waits for it: Ctrl-C, SIGTERM
  or SIGHUP (the terminal closed) there send it SIGTERM, and on Linux the server gets SIGTERM when ``lmdepth
  explore`` ends however it ends, a SIGKILL included (``PR_SET_PDEATHSIG``);
* :func:`main` (the server's process) runs Voilà in this process and, when Voilà ends, however it was stopped,
  removes the folder it served from: ``lmdepth explore`` may be gone (a SIGKILL) and cannot remove it then;
* :func:`sweep` (at every start) removes the folders that a server killed before it could clean up left behind
  (both processes SIGKILLed), once the process that made them is gone (:func:`lmdepth.results.orphaned`).

This module imports only the standard library at its top: the server's process installs its SIGTERM handler before
anything slow is imported, so a stop during its start still removes the folder.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

#: The module that runs as the server's process (``python -m``).
MODULE = "lmdepth.book.explore_server"
#: The label of the explorer's temporary folders (:func:`lmdepth.results.temp_dir`): ``.lmdepth-tmp-explore-…``.
FOLDER_LABEL = "explore-"


def sweep(parent: Path) -> list[Path]:
    """Remove the explorer's folders in ``parent`` whose maker is no longer running (what servers killed before they
    could remove their own left); returns them."""
    from lmdepth.results import TMP_PREFIX, orphaned

    gone = [p for p in sorted(Path(parent).glob(f"{TMP_PREFIX}{FOLDER_LABEL}*")) if orphaned(p)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _die_with_parent() -> None:
    """In the server's process (Linux): end when the process that started it ends, however it ends (a SIGKILL of
    ``lmdepth explore`` must not leave the server holding the port)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the signal handlers of run() remain
        pass


def run(cmd: list[str], folder: Path, env: Mapping[str, str]) -> int:
    """Run the server ``cmd`` in ``folder`` until it ends (Ctrl-C, SIGTERM or SIGHUP here stop it); returns its exit
    status, 130 after Ctrl-C."""
    # Its own session: Ctrl-C reaches only this process (Voilà would ask on the terminal whether to stop, or ignore
    # SIGINT when started in the background); Ctrl-C or SIGTERM here sends it SIGTERM, on which it shuts its kernel
    # down, removes the folder and exits.
    server = subprocess.Popen(cmd, cwd=folder, env=dict(env), start_new_session=True, preexec_fn=_die_with_parent)
    # SIGTERM, or SIGHUP (the terminal closed), stops the server the same way
    previous = {sig: signal.signal(sig, lambda *_: server.terminate()) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_IGN)  # once: a second one during the cleanup is ignored
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    """The server's process: Voilà serving ``argv`` (the notebook, then Voilà's options) in this process; when it
    ends, the notebook's folder is removed if it is a temporary the library made (:func:`lmdepth.results.temp_dir`)."""
    folder = Path(argv[0]).resolve().parent
    try:
        # until Voilà installs its own handler (which stops its loop): a SIGTERM while it starts still removes the
        # folder. Installed inside the try, so a SIGTERM from here on reaches the finally below (one before it, in
        # the moment the interpreter starts, kills without cleanup: the next start's sweep removes that folder).
        signal.signal(signal.SIGTERM, _stop)
        from voila.app import main as voila

        voila(argv)
    finally:
        # a second SIGTERM (its parent's death can bring two, 30 ms apart) must not cut the removal short: it raised
        # SystemExit again inside this block and left the folder behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from lmdepth.results import is_temporary

        if is_temporary(folder):  # never a user's folder, whatever notebook this was given
            shutil.rmtree(folder, ignore_errors=True)
    return 0


__all__ = ["MODULE", "FOLDER_LABEL", "sweep", "run", "main"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
