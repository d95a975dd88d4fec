//! The bench commands' charts: bandwidth and latency against message size, one line per
//! system, as one self-contained SVG file (no script, no external font or style), which a
//! browser, GitHub and mdBook all show.

use std::fmt::Write;

/// One system's measured points: (message size in bytes, value).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One panel: a quantity against message size (log 2 axis).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Panel {
    pub(crate) y_label: String,
    pub(crate) series: Vec<Series>,
}

const W: f64 = 560.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 110.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn size_label(b: f64) -> String {
    let b = b as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// A "nice" upper bound for the y axis (1, 2 or 5 times a power of ten).
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * p)
}

/// The chart: `panels` side by side under `title`. Points with a non-positive size are left
/// out; a panel with no point says so.
pub(crate) fn chart(title: &str, panels: &[Panel]) -> String {
    let n = panels.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
        w = W * n,
        h = H + 30.0
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#,
        W * n / 2.0,
        esc(title)
    );
    for (pi, p) in panels.iter().enumerate() {
        let x0 = pi as f64 * W + LEFT;
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let y0 = 30.0 + TOP;
        let pts: Vec<(f64, f64)> = p
            .series
            .iter()
            .flat_map(|se| se.points.iter().copied())
            .filter(|(x, y)| *x > 0.0 && y.is_finite())
            .collect();
        let _ = writeln!(
            s,
            r##"<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );

        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">message size (bytes)</text>"#,
            x0 + pw / 2.0,
            y0 + ph + 32.0
        );
        if pts.is_empty() {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">no measurement</text>"#,
                x0 + pw / 2.0,
                y0 + ph / 2.0
            );
            continue;
        }
        let lx = |x: f64| x.log2();
        let (mut xmin, mut xmax) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| {
            (a.min(lx(*x)), b.max(lx(*x)))
        });
        if xmax - xmin < 1.0 {
            xmin -= 0.5;
            xmax += 0.5;
        }
        let ymax = nice_max(pts.iter().fold(0.0f64, |m, (_, y)| m.max(*y)));
        // Systems far apart (a shared-memory transport beside one over TCP): a log axis, so
        // that the slower lines are not flat on the floor.
        let ymin_pos = pts
            .iter()
            .map(|(_, y)| *y)
            .filter(|y| *y > 0.0)
            .fold(f64::MAX, f64::min);
        let log_y = ymin_pos < f64::MAX && ymax / ymin_pos > 50.0;
        let (lo, hi) = if log_y {
            (
                ymin_pos.log10().floor(),
                ymax.log10().ceil().max(ymin_pos.log10().floor() + 1.0),
            )
        } else {
            (0.0, ymax)
        };
        let px = |x: f64| x0 + (lx(x) - xmin) / (xmax - xmin) * pw;
        let py = |y: f64| {
            let f = if log_y {
                (y.max(10f64.powf(lo)).log10() - lo) / (hi - lo)
            } else {
                y / ymax
            };
            y0 + ph - f * ph
        };
        // Grid and ticks: sizes at powers of two, values at fifths.
        for k in (xmin.ceil() as i64)..=(xmax.floor() as i64) {
            let x = 2f64.powi(k as i32);
            let _ = writeln!(
                s,
                r##"<line x1="{X}" y1="{y0}" x2="{X}" y2="{yb}" stroke="#eee"/><text x="{X}" y="{ty}" text-anchor="middle">{l}</text>"##,
                X = px(x),
                yb = y0 + ph,
                ty = y0 + ph + 16.0,
                l = size_label(x)
            );
        }
        let ticks: Vec<f64> = if log_y {
            (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect()
        } else {
            (0..=5).map(|k| ymax * f64::from(k) / 5.0).collect()
        };
        for y in ticks {
            let _ = writeln!(
                s,
                r##"<line x1="{x0}" y1="{Y}" x2="{xr}" y2="{Y}" stroke="#eee"/><text x="{tx}" y="{ty}" text-anchor="end">{y}</text>"##,
                Y = py(y),
                xr = x0 + pw,
                tx = x0 - 6.0,
                ty = py(y) + 4.0,
                y = format_value(y)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}{}</text>"#,
            x0 - 50.0,
            y0 + ph / 2.0,
            x0 - 50.0,
            y0 + ph / 2.0,
            esc(&p.y_label),
            if log_y { ", log scale" } else { "" }
        );
        for (si, se) in p.series.iter().enumerate() {
            let color = COLORS[si % COLORS.len()];
            let mut line: Vec<(f64, f64)> = se
                .points
                .iter()
                .copied()
                .filter(|(x, y)| *x > 0.0 && y.is_finite())
                .collect();
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = line
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect();
            let _ = writeln!(
                s,
                r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"##,
                path.join(" ")
            );
            for (x, y) in &line {
                let _ = writeln!(
                    s,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: {} B, {}</title></circle>"##,
                    px(*x),
                    py(*y),
                    esc(&se.name),
                    *x as u64,
                    format_value(*y)
                );
            }
            // Legend under the panel, two columns.
            let (lx0, ly0) = (
                x0 + (si % 2) as f64 * pw / 2.0,
                y0 + ph + 50.0 + (si / 2) as f64 * 16.0,
            );
            let _ = writeln!(
                s,
                r##"<line x1="{lx0}" y1="{ly}" x2="{lx1}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{tx}" y="{ty}">{name}</text>"##,
                ly = ly0 - 4.0,
                lx1 = lx0 + 18.0,
                tx = lx0 + 24.0,
                ty = ly0,
                name = esc(&se.name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn format_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_and_a_legend_entry_per_system_and_a_point_per_measurement() {
        let panels = [
            Panel {
                y_label: "Gb/s".into(),
                series: vec![
                    Series {
                        name: "A & <b>".into(),
                        points: vec![(4096.0, 1.0), (65536.0, 5.0), (1024.0, 0.5)],
                    },
                    Series {
                        name: "B".into(),
                        points: vec![(4096.0, 2.0), (0.0, 9.0)],
                    },
                ],
            },
            Panel {
                y_label: "µs".into(),
                series: vec![],
            },
        ];
        let svg = chart("title", &panels);
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        // The zero-size point is left out.
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("A &amp; &lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains("no measurement"));
        assert!(svg.contains(">64K<") && svg.contains(">1K<"));
        // Balanced tags (a cheap well-formedness check).
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn values_far_apart_get_a_log_axis() {
        let panel = |hi: f64| Panel {
            y_label: "Gb/s".into(),
            series: vec![Series {
                name: "x".into(),
                points: vec![(4096.0, 1.0), (65536.0, hi)],
            }],
        };
        assert!(chart("t", &[panel(500.0)]).contains("log scale"));
        assert!(!chart("t", &[panel(5.0)]).contains("log scale"));
    }

    #[test]
    fn nice_bounds() {
        assert_eq!(nice_max(7.3), 10.0);
        assert_eq!(nice_max(0.42), 0.5);
        assert_eq!(nice_max(150.0), 200.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
