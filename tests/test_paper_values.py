"""The paper on the figures: one registry of what the paper reports (lmdepth.claims.paper_values), each chapter's
main figure drawing it (lmdepth.charts.paper_marks), and the executed pages carrying the marks."""

from __future__ import annotations

import json

import jupytext
import nbformat
import pytest

from lmdepth.book.chapters import CHAPTERS
from lmdepth.charts.paper_marks import match_marks, paper_marks
from lmdepth.claims.paper_values import MAPS_EXAMPLE, PAPER_VALUES, Mark, PaperValue, reported
from lmdepth.runtime import REPO_ROOT

pytestmark = pytest.mark.unit

#: The figures of each chapter that carry the paper's marks (the chapter's main figure first).
MARKED = {
    "norms": ("fig-norms-relative", "fig-norms-models"),
    "cosine": ("fig-cos-components", "fig-cos-models"),
    "skipping": ("fig-skip-models",),
    "lens": ("fig-lens-layers", "fig-lens-settling"),
    "maps": ("fig-maps-heatmap",),
}


def _figure_cell(cells, name: str):
    found = [c for c in cells if c.cell_type == "code"
             and c.metadata.get("mystnb", {}).get("figure", {}).get("name") == name]
    assert len(found) == 1, name
    return found[0]


def test_every_value_is_typed_and_placed():
    for v in PAPER_VALUES:
        assert v.chapter in CHAPTERS and v.figure.startswith("Fig. ") and v.model and v.says, v
        assert 0 <= v.depth[0] <= 1 and 0 <= v.depth[1] <= 1, v
        assert (v.value is not None) == (v.mark in (Mark.ABOVE, Mark.BELOW)), v
        assert v.mark is Mark.MATCH or v.depth[0] <= v.depth[1], v
        assert v.label == f"paper, {v.model}"
    (shallow, n_shallow), (deep, n_deep) = MAPS_EXAMPLE
    assert reported("maps")[0].depth == (shallow / n_shallow, deep / n_deep)


def test_reported_filters_by_chapter_and_curve():
    assert {v.chapter for v in PAPER_VALUES} == set(MARKED)
    assert reported("norms", "attention") == () and len(reported("norms", "layer")) == 2
    assert reported("cosine", "mlp") == reported("cosine") and reported("complexity") == ()


@pytest.mark.parametrize("key", sorted(MARKED))
def test_the_chapter_draws_the_registry_on_its_figures(key):
    """Each marked figure's call passes the chapter's values from the registry (no value typed in the chapter)."""
    cells = jupytext.read(REPO_ROOT / "notebooks" / f"{CHAPTERS[key]}.py").cells
    for name in MARKED[key]:
        assert f'paper=reported("{key}")' in _figure_cell(cells, name).source, name
    source = (REPO_ROOT / "notebooks" / f"{CHAPTERS[key]}.py").read_text()
    for v in reported(key):
        assert v.value is None or f"{v.value:g}" not in source, f"{key}: the paper's {v.value:g} typed in the chapter"


@pytest.mark.parametrize("key", sorted(MARKED))
def test_the_executed_figures_carry_the_marks(key):
    nb = nbformat.read(REPO_ROOT / "book" / f"{CHAPTERS[key]}.ipynb", as_version=4)
    for name in MARKED[key]:
        shown = json.dumps([o.get("data", {}) for o in _figure_cell(nb.cells, name).outputs], ensure_ascii=False)
        for v in reported(key):
            assert v.label in shown and v.says in shown, f"{name}: no mark of {v.figure} (re-execute {key})"


def test_bounds_shade_under_the_data_and_rule_over_it():
    norms = paper_marks(reported("norms"))
    assert [c.mark.type for c in norms.behind] == ["rect", "rect"]
    assert [c.mark.type for c in norms.front] == ["rule", "rule", "text", "text"]  # the label: halo, then text
    assert norms.around("data")[2] == "data"
    where = paper_marks(reported("cosine"), n_layers=30, label=False)
    assert where.behind == [] and [c.mark.type for c in where.front] == ["rule"]
    assert where.front[0].data["x"].tolist() == [15.0]  # mid-depth in layer units
    assert [c.mark.type for c in paper_marks(reported("skipping")).behind] == ["rect"]
    assert not paper_marks(reported("maps")) and not paper_marks(())


def test_a_match_is_mirrored_on_a_map_from_the_deeper_model():
    import altair as alt

    v = PaperValue("maps", "Fig. 8", "A → B", Mark.MATCH, (0.25, 0.75))
    scale = alt.Scale()
    shallow_to_deep = match_marks([v], n_source=20, n_target=40, x_scale=scale, y_scale=scale)[0].data
    deep_to_shallow = match_marks([v], n_source=40, n_target=20, x_scale=scale, y_scale=scale)[0].data
    assert (shallow_to_deep.m[0], shallow_to_deep.l[0]) == (5.0, 30.0)  # source 0.25 of 20, target 0.75 of 40
    assert (deep_to_shallow.m[0], deep_to_shallow.l[0]) == (30.0, 5.0)
