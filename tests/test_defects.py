"""The rendered-page defect checker (lmdepth.book.defects) on hand-made pages: each defect is found, a clean page
passes. The checker itself runs on every page of the smoke book in tests/test_book.py."""

import json

import pytest

from lmdepth.book.defects import MAX_COLUMNS_UNSCROLLED, expected_tables, page_defects

pytestmark = pytest.mark.unit


def page(body: str, width=800, figures=(), tables=(), page_width=1385, window=1400) -> str:
    """A measured page; a figure is its drawn width, or (drawn width, its box's width, whether it shows the cue)."""
    figures = [(f, width, False) if isinstance(f, (int, float)) else f for f in figures]
    meas = {"width": width, "figures": [{"i": i, "width": w, "box": box, "cue": cue} for i, (w, box, cue) in enumerate(figures)],
            "tables": [{"i": i, "width": w, "columns": c, "id": tid} for i, (w, c, tid) in enumerate(tables)],
            "page": {"width": page_width, "window": window}}
    return f'<html><body>{body}<pre id="lmdepth-measure">{json.dumps(meas).replace("&", "&amp;")}</pre></body></html>'


def test_a_clean_page_passes():
    body = ('<p>costs $5 and $7</p><mjx-container>$d \\times d$</mjx-container><code>$x_1$</code>'
            '<table id="T_a"><tr><td>0.5</td><td>—</td></tr></table>')
    assert page_defects(page(body, figures=[790], tables=[(1200, MAX_COLUMNS_UNSCROLLED, "T_a")]), n_tables=1) == []


def test_each_defect_is_found():
    wide = page("", figures=[799, 991])
    assert page_defects(wide) == ["figure 2 is 991 px wide, the text column 800 px"]
    table = page("", tables=[(1246, 11, "T_b")])
    assert page_defects(table) == ["table 1 (11 columns) is 1246 px wide, the text column 800 px"]
    latex = page("<p>a map of size $d \\times d$ and $x_1$, twice: $d \\times d$</p>")
    assert page_defects(latex) == ["raw LaTeX: '$d \\\\times d$'", "raw LaTeX: '$x_1$'"]
    cells = page("<table><tr><td>nan</td><td> None </td><td>&lt;NA&gt;</td><td>nano</td></tr></table>")
    assert page_defects(cells) == ["3 table cells read ['&lt;NA&gt;', 'None', 'nan']"]
    assert page_defects(page("", tables=[(300, 2, "T_c")]), n_tables=2) == ["1 of 2 show_table tables rendered"]
    assert page_defects("<html>no scripts ran</html>") == ["no layout measurements: the page's scripts did not finish"]
    # the theme gives a <pre> wider than the page tabindex="0": the measurements are still read
    themed = page("", figures=[991]).replace('<pre id="lmdepth-measure">', '<pre id="lmdepth-measure" tabindex="0">')
    assert page_defects(themed) == ["figure 1 is 991 px wide, the text column 800 px"]


def test_expected_tables_counts_unconditional_calls_only():
    src = "show_table(a)\nshow_table(b) if len(b) else None\n    show_table(c)\nx = show_table\nshow_table(d)\n"
    assert expected_tables(src) == 2


def test_the_runs_table_fits_and_skipped_updates_are_reported():
    from pathlib import Path

    from lmdepth.analyses.scratch import TrainedRun
    from lmdepth.book.pages.scratch_page import runs_table, skipped_md

    meta = {"n_parameters": 1_080_000, "active_parameters": 600_000, "wall_time_s": 600.0, "cpu_time_s": 540.0,
            "train_config": {"steps": 16_000, "batch_size": 32, "lr": 0.001, "modules": ["arithmetic__add_or_sub"]},
            "history": [(1, 2.0), (2, 1.0)]}  # a training run's meta as it is stored (no model needed here)
    runs = {"moeut-lm": TrainedRun("moeut-lm", "moeut", "lm", None, None, {**meta, "skipped_updates": [3238]}, Path(".")),
            "transformer-lm": TrainedRun("transformer-lm", "transformer", "lm", None, None,
                                         {**meta, "history": [(1, 2.0), (2, float("nan"))]}, Path("."))}
    t = runs_table(runs)
    assert t.shape == (2, MAX_COLUMNS_UNSCROLLED)
    assert t.iloc[0].tolist()[2:] == ["1.08M / 0.60M", "16,000 × 32, 0.001", "10.0 / 9.0", 1.5]
    assert skipped_md(runs) == (" Updates skipped for a non-finite gradient (the step is recorded, the weights left "
                                "as they were): moeut-lm 1 (first at step 3,239); transformer-lm 1 (first at step 2).")
    runs["moeut-lm"].meta["skipped_updates"] = []
    del runs["transformer-lm"]
    assert skipped_md(runs) == " No update was skipped for a non-finite gradient."


def test_a_page_wider_than_its_window_is_a_defect_on_a_desktop_and_on_a_phone():
    """A page that scrolls sideways as a whole; on a phone a chart wider than the column scrolls in its own box
    (lmdepth.book.narrow_screens), and must say so: a wide chart without the scroll cue is a defect there."""
    assert page_defects(page("", page_width=1400)) == []
    assert page_defects(page("", page_width=1412)) == ["the page is 1412 px wide in a 1400 px window: it scrolls sideways"]
    phone = page("<p>$x_1$</p>", width=358, figures=[(676, 358, True)], page_width=724, window=390)
    assert page_defects(phone, phone=True) == ["the page is 724 px wide in a 390 px window: it scrolls sideways"]
    assert page_defects(page("", width=358, figures=[(676, 358, True), (300, 358, False)], page_width=375,
                             window=390), phone=True) == []
    silent = page("", width=358, figures=[(300, 358, False), (676, 358, False)], page_width=375, window=390)
    assert page_defects(silent, phone=True) == ["figure 2 is 676 px wide in a 358 px box with no scroll cue"]


def test_the_narrow_screen_stylesheet_ships_with_every_html_build(tmp_path):
    import yaml

    from lmdepth.book import narrow_screens
    from lmdepth.runtime import REPO_ROOT

    class App:  # what setup() asks of Sphinx
        outdir, css, js, hooks = tmp_path / "html", [], [], {}
        builder = type("Builder", (), {"format": "html"})()
        add_css_file = lambda self, name: self.css.append(name)  # noqa: E731
        add_js_file = lambda self, name: self.js.append(name)  # noqa: E731
        connect = lambda self, event, fn: self.hooks.setdefault(event, fn)  # noqa: E731

    app = App()
    assert narrow_screens.setup(app)["parallel_read_safe"]
    app.hooks["builder-inited"](app)
    css = (app.outdir / "_static" / narrow_screens.CSS_NAME).read_text()
    js = (app.outdir / "_static" / narrow_screens.JS_NAME).read_text()
    assert app.css == [narrow_screens.CSS_NAME] and ".lmdepth-vega" in css and "overflow-x: auto" in css
    assert app.js == [narrow_screens.JS_NAME] and f"'{narrow_screens.WIDE_CLASS}'" in js
    assert f'.{narrow_screens.WIDE_CLASS}::before {{ content: "{narrow_screens.SCROLL_CUE} ' in css
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    assert "lmdepth.book.narrow_screens" in config["sphinx"]["extra_extensions"]
