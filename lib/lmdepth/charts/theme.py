"""The book's altair theme, one colour per component, component labels and the model palette.

Every chart module of :mod:`lmdepth.charts` imports this one, which registers and enables the theme. Chart builders
(one module per chapter) take an aggregated tidy table and return a chart; they never compute metrics.
Interactions are Vega-Lite params (legend toggles, radio buttons, tooltips), which keep working in the static
offline book.
"""

from __future__ import annotations

import altair as alt

COMPONENT_COLORS = {
    "attention": "#4C78A8",
    "mlp": "#F58518",
    "layer": "#54A24B",
    "io": "#B279A2",
    "residual": "#72B7B2",
}
COMPONENT_LABELS = {
    ("relative_contribution", "attention"): "Attention: ‖a_l‖/‖h_l‖",
    ("relative_contribution", "mlp"): "MLP: ‖m_l‖/‖h_l+a_l‖",
    ("relative_contribution", "layer"): "Attention + MLP: ‖a_l+m_l‖/‖h_l‖",
    ("cosine", "attention"): "cos(a_l, h_l)",
    ("cosine", "mlp"): "cos(m_l, h_l+a_l)",
    ("cosine", "layer"): "cos(a_l+m_l, h_l)",
    ("cosine", "io"): "cos(h_(l+1), h_l)",
    ("norm", "residual"): "Residual ‖h_l‖",
    ("norm", "attention"): "Attention ‖a_l‖",
    ("norm", "mlp"): "MLP ‖m_l‖",
    ("norm", "layer"): "Layer ‖a_l+m_l‖",
}
MODEL_PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"]


@alt.theme.register("lmdepth", enable=True)
def _theme() -> alt.theme.ThemeConfig:
    return {
        "config": {
            "view": {"continuousWidth": 560, "continuousHeight": 260, "stroke": None},
            "axis": {"labelFontSize": 11, "titleFontSize": 12, "grid": True, "gridOpacity": 0.4},
            "legend": {"labelFontSize": 11, "titleFontSize": 12, "labelLimit": 260},
            "font": "system-ui, -apple-system, 'Segoe UI', sans-serif",
        }
    }
