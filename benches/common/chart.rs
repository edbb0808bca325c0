//! A small two-panel SVG chart, no dependencies: two figures of each point against N, both
//! axes logarithmic, one polyline per line.

use std::fmt::Write as _;

/// One line of the chart: its legend, colour, and its points (N, then the figure of each
/// panel).
pub(crate) struct Line {
    pub(crate) name: &'static str,
    pub(crate) color: &'static str,
    pub(crate) points: Vec<(usize, [f64; 2])>,
}

/// The SVG of `lines`, a panel per title of `titles` (left, right). A line without points
/// draws nothing but keeps its legend slot.
pub(crate) fn svg(titles: [&str; 2], lines: &[Line]) -> String {
    let ns: Vec<usize> = {
        let mut v: Vec<usize> = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (w, h, pad) = (420.0, 300.0, 55.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        2.0 * w,
        h + 30.0
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let xmin = (*ns.first().unwrap_or(&1) as f64).log10();
    let xmax = (*ns.last().unwrap_or(&10) as f64).log10().max(xmin + 1.0);
    for (pi, title) in titles.iter().enumerate() {
        let ox = pi as f64 * w;
        let vals: Vec<f64> = lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1[pi]))
            .filter(|v| *v > 0.0)
            .collect();
        let lo = vals
            .iter()
            .cloned()
            .fold(f64::MAX, f64::min)
            .max(1e-3)
            .log10()
            .floor();
        let hi = vals
            .iter()
            .cloned()
            .fold(0.0, f64::max)
            .max(1e-3)
            .log10()
            .ceil()
            .max(lo + 1.0);
        let x = |n: f64| ox + pad + (n.log10() - xmin) / (xmax - xmin) * (w - 2.0 * pad);
        let y = |v: f64| h - pad + 20.0 - (v.max(1e-9).log10() - lo) / (hi - lo) * (h - 2.0 * pad);
        let _ = write!(
            s,
            r#"<text x="{}" y="18" font-size="13">{title}</text>"#,
            ox + pad
        );
        let _ = write!(
            s,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
            ox + pad,
            pad + 20.0,
            w - 2.0 * pad,
            h - 2.0 * pad
        );
        let mut e = lo;
        while e <= hi {
            let yy = y(10f64.powf(e));
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">1e{}</text>"#,
                ox + pad - 4.0,
                yy + 4.0,
                e
            );
            e += 1.0;
        }
        for &n in &ns {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">N={n}</text>"#,
                x(n as f64),
                h - pad + 35.0
            );
        }
        for (li, line) in lines.iter().enumerate() {
            let color = line.color;
            let pts: Vec<(f64, f64)> = line
                .points
                .iter()
                .map(|(n, v)| (x(*n as f64), y(v[pi])))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
            let _ = write!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                path.join(" ")
            );
            for (a, b) in &pts {
                let _ = write!(
                    s,
                    r#"<circle cx="{a:.1}" cy="{b:.1}" r="3" fill="{color}"/>"#
                );
            }
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" fill="{color}">{}</text>"#,
                ox + pad + 8.0,
                pad + 36.0 + 15.0 * li as f64,
                line.name
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
