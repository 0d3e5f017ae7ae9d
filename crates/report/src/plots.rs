//! SVG figures drawn with plotters' SVG backend (text as SVG text, no font files).

use plotters::prelude::*;

/// One line or point series.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Draw points (measured) or a line (predicted / planned).
    pub kind: SeriesKind,
    pub color: usize,
}

#[derive(Clone, Copy, PartialEq)]
pub enum SeriesKind {
    Line,
    DashedLine,
    Points,
    LineAndPoints,
}

/// A labelled marker at a point.
pub struct Marker {
    pub x: f64,
    pub y: f64,
    pub text: String,
    pub color: usize,
}

/// A figure: axes, series, markers.
pub struct Figure {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

impl Figure {
    /// The figure as an `<svg>` element.
    pub fn svg(&self, width: u32, height: u32) -> String {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (width, height)).into_drawing_area();
            // Drawing into a string cannot fail for I/O reasons; an empty figure is still valid SVG.
            let _ = self.draw(&root);
            let _ = root.present();
        }
        out
    }

    fn draw(&self, root: &DrawingArea<SVGBackend, plotters::coord::Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(err)?;
        let all: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .chain(self.markers.iter().map(|m| (m.x, m.y)))
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        if all.is_empty() {
            root.draw(&Text::new("no data", (20, 20), ("sans-serif", 14)))
                .map_err(err)?;
            return Ok(());
        }
        let (mut x0, mut x1) = all
            .iter()
            .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
        let y1 = all.iter().map(|p| p.1).fold(f64::MIN, f64::max) * 1.1;
        let y0 = all.iter().map(|p| p.1).fold(f64::MAX, f64::min).min(0.0);
        let y1 = if y1 <= y0 { y0 + 1.0 } else { y1 };
        if self.log_x {
            x0 = x0.max(1e-9) / 1.5;
            x1 *= 1.5;
        } else if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(&self.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        if self.log_x {
            let mut chart = builder
                .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(&self.x_label)
                .y_desc(&self.y_label)
                .x_label_formatter(&|v| format_tick(*v))
                .y_label_formatter(&|v| format_tick(*v))
                .draw()
                .map_err(err)?;
            self.draw_series(&mut chart)?;
        } else {
            let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(&self.x_label)
                .y_desc(&self.y_label)
                .x_label_formatter(&|v| format_tick(*v))
                .y_label_formatter(&|v| format_tick(*v))
                .draw()
                .map_err(err)?;
            self.draw_series(&mut chart)?;
        }
        Ok(())
    }

    fn draw_series<'a, X, Y>(
        &self,
        chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    ) -> Result<(), String>
    where
        X: Ranged<ValueType = f64>,
        Y: Ranged<ValueType = f64>,
    {
        for s in &self.series {
            let c = color(s.color);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect();
            let style = ShapeStyle::from(&c).stroke_width(2);
            match s.kind {
                SeriesKind::Line | SeriesKind::LineAndPoints => {
                    let drawn = chart
                        .draw_series(LineSeries::new(pts.clone(), style))
                        .map_err(err)?;
                    if !s.label.is_empty() {
                        drawn
                            .label(s.label.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
                    }
                }
                SeriesKind::DashedLine => {
                    let drawn = chart
                        .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                        .map_err(err)?;
                    if !s.label.is_empty() {
                        drawn
                            .label(s.label.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
                    }
                }
                SeriesKind::Points => {
                    chart
                        .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                        .map_err(err)?
                        .label(s.label.clone())
                        .legend(move |(x, y)| Circle::new((x + 9, y), 4, c.filled()));
                }
            }
            if s.kind == SeriesKind::LineAndPoints {
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
                    .map_err(err)?;
            }
        }
        for m in &self.markers {
            let c = color(m.color);
            chart
                .draw_series(std::iter::once(TriangleMarker::new(
                    (m.x, m.y),
                    8,
                    c.filled(),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    m.text.clone(),
                    (m.x, m.y),
                    ("sans-serif", 13).into_font().color(&c),
                )))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Short tick labels: 1.2k, 3.4M, 0.05.
pub fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}
