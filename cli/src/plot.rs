//! `bench --plot`: SVG figures from the JSON lines `bench` prints after its tables, ours
//! beside llama.cpp's, with the host they were measured on in every caption (figures are
//! comparable only within one host). No Python: plotters' SVG backend, which writes text
//! as SVG `<text>` and so needs no fonts.
//!
//! Figures, each written only when the lines hold what it needs:
//! - `decode-vs-depth.svg`: tg128 tok/s against the tokens already cached (`--depth`), one
//!   line per engine and weights measured at two depths or more;
//! - `streams.svg`: aggregate decode tok/s against sequences decoded together (`--streams`);
//! - `prompt-and-decode.svg`: pp512 and tg128 from an empty cache, one bar per engine and
//!   weights.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

/// The machine a line was measured on, as `bench` prints it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Host {
    pub cpu: String,
    pub cores: usize,
    pub features: String,
    pub kernels: String,
}

/// Whose figure a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Kind {
    #[serde(rename = "ours")]
    Ours,
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
}

/// What every line says about how it was measured.
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub engine: String,
    pub kind: Kind,
    pub threads: usize,
    pub runs: usize,
    /// How our weights were kept; none for llama.cpp's (its GGUF's, named in `engine`).
    pub weights: Option<String>,
    pub matmul: Option<String>,
    pub kv_cache: Option<String>,
    pub read_bandwidth_gb_s: f64,
    pub host: Host,
    /// When the bench started, UTC (`2026-11-25T06:40:12Z`).
    pub date: String,
    /// The machine's 1-minute load average then: in the lines, not the captions, since
    /// benches run back to back count the previous one's load.
    pub load_average: Option<f64>,
}

impl Run {
    /// The legend's name of a series: llama.cpp by its GGUF, ours by how the weights were
    /// kept and multiplied (what tells two of our rows apart).
    pub fn label(&self) -> String {
        if self.kind == Kind::LlamaCpp {
            return self.engine.clone();
        }
        let mut label = format!("ours {}", self.engine);
        if let Some(weights) = &self.weights {
            label += &format!(" {weights}");
        }
        if let Some(matmul) = self.matmul.as_deref().filter(|&m| m != "exact") {
            label += &format!(" {matmul}");
        }
        if let Some(kv) = self.kv_cache.as_deref().filter(|&kv| kv != "f32") {
            label += &format!(" kv {kv}");
        }
        label
    }
}

/// One line of `bench` without `--streams`.
#[derive(Debug, Clone, Deserialize)]
pub struct Decode {
    #[serde(flatten)]
    pub run: Run,
    pub depth: usize,
    pub pp512_tok_s: f64,
    pub tg128_tok_s: f64,
}

/// One line of `bench --streams`.
#[derive(Debug, Clone, Deserialize)]
pub struct Streams {
    #[serde(flatten)]
    pub run: Run,
    pub streams: usize,
    pub aggregate_tok_s: f64,
}

/// Every line of the inputs, by what it measured.
#[derive(Debug, Default)]
pub struct Lines {
    pub decode: Vec<Decode>,
    pub streams: Vec<Streams>,
}

impl Lines {
    /// Reads `bench`'s JSON lines (blank lines skipped). Anything else, or a line without a
    /// field a figure needs, is an error naming the file and line.
    pub fn read(paths: &[PathBuf]) -> Result<Self> {
        let mut lines = Lines::default();
        for path in paths {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                lines
                    .push(line)
                    .with_context(|| format!("{} line {}", path.display(), n + 1))?;
            }
        }
        if lines.decode.is_empty() && lines.streams.is_empty() {
            bail!("no JSON lines of `bench` in {}", names(paths));
        }
        lines.one_host()?;
        Ok(lines)
    }

    fn push(&mut self, line: &str) -> Result<()> {
        let value: serde_json::Value = serde_json::from_str(line)
            .context("not a JSON line of `bench` (it prints them after its tables)")?;
        if !value.is_object() {
            bail!("not a JSON object, as `bench`'s lines are");
        }
        // A `--streams` line is the one with a stream count; parsed as its own kind, so a
        // missing field is named rather than "matches no variant".
        let what = "a field of `bench`'s JSON lines";
        if value.get("streams").is_some() {
            self.streams
                .push(serde_json::from_value(value).context(what)?);
        } else {
            self.decode
                .push(serde_json::from_value(value).context(what)?);
        }
        Ok(())
    }

    fn runs(&self) -> impl Iterator<Item = &Run> {
        let decode = self.decode.iter().map(|d| &d.run);
        decode.chain(self.streams.iter().map(|s| &s.run))
    }

    /// Figures from two machines would put incomparable figures on one axis.
    fn one_host(&self) -> Result<()> {
        let mut runs = self.runs();
        let first = &runs.next().expect("checked non-empty").host;
        if let Some(other) = runs.find(|run| &run.host != first) {
            bail!(
                "lines from two hosts ({}; {}): plot each host's lines on their own",
                first.cpu,
                other.host.cpu
            );
        }
        Ok(())
    }
}

fn names(paths: &[PathBuf]) -> String {
    let names: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

/// Writes every figure the lines hold into `dir`, returning the files written.
pub fn write_figures(lines: &Lines, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let figures: [(&str, Option<String>); 3] = [
        ("decode-vs-depth.svg", decode_vs_depth(lines)?),
        ("streams.svg", streams(lines)?),
        ("prompt-and-decode.svg", prompt_and_decode(lines)?),
    ];
    let mut written = Vec::new();
    for (name, svg) in figures {
        let Some(svg) = svg else { continue };
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// One line of a figure: its name, whose it is, and its points by x.
struct Series {
    label: String,
    kind: Kind,
    points: BTreeMap<usize, f64>,
}

/// Groups `(run, x, y)` by series label, in the order the series first appear; a later
/// line at the same x replaces an earlier one (a rerun).
fn series<'a>(items: impl Iterator<Item = (&'a Run, usize, f64)>) -> Vec<Series> {
    let mut all: Vec<Series> = Vec::new();
    for (run, x, y) in items {
        let label = run.label();
        let at = match all.iter().position(|s| s.label == label) {
            Some(at) => at,
            None => {
                let points = BTreeMap::new();
                all.push(Series {
                    label,
                    kind: run.kind,
                    points,
                });
                all.len() - 1
            }
        };
        all[at].points.insert(x, y);
    }
    all
}

fn decode_vs_depth(lines: &Lines) -> Result<Option<String>> {
    let items = lines
        .decode
        .iter()
        .map(|d| (&d.run, d.depth, d.tg128_tok_s));
    // A series at one depth says nothing about depth (the quantized rows, say).
    let all: Vec<Series> = (series(items).into_iter())
        .filter(|s| s.points.len() > 1)
        .collect();
    let runs = lines.decode.iter().map(|d| &d.run);
    let Some(caption) = Caption::of(runs.filter(|r| all.iter().any(|s| s.label == r.label())))
    else {
        return Ok(None);
    };
    let title = "Decode (tg128) after N tokens in the KV cache";
    let axes = ("tokens already in the cache (depth)", "decode tok/s");
    line_figure(title, &caption, axes, &all, SeriesLabelPosition::UpperRight).map(Some)
}

fn streams(lines: &Lines) -> Result<Option<String>> {
    let items = lines.streams.iter();
    let all = series(items.map(|s| (&s.run, s.streams, s.aggregate_tok_s)));
    let Some(caption) = Caption::of(lines.streams.iter().map(|s| &s.run)) else {
        return Ok(None);
    };
    let title = "Batched decode: sequences decoded together, tok/s in all";
    let axes = ("sequences decoded together", "aggregate decode tok/s");
    line_figure(title, &caption, axes, &all, SeriesLabelPosition::UpperLeft).map(Some)
}

fn prompt_and_decode(lines: &Lines) -> Result<Option<String>> {
    let empty: Vec<&Decode> = lines.decode.iter().filter(|d| d.depth == 0).collect();
    let Some(caption) = Caption::of(empty.iter().map(|d| &d.run)) else {
        return Ok(None);
    };
    // One bar per series, a later line of the same series replacing an earlier one.
    let mut bars: Vec<(String, Kind, f64, f64)> = Vec::new();
    for d in empty {
        let bar = (d.run.label(), d.run.kind, d.pp512_tok_s, d.tg128_tok_s);
        match bars.iter_mut().find(|b| b.0 == bar.0) {
            Some(b) => *b = bar,
            None => bars.push(bar),
        }
    }
    let title = "Prompt (pp512) and decode (tg128) from an empty cache";
    svg(title, &caption, |area| {
        let panels = area.split_evenly((1, 2));
        let pp512: Vec<_> = bars.iter().map(|b| (b.0.as_str(), b.1, b.2)).collect();
        let tg128: Vec<_> = bars.iter().map(|b| (b.0.as_str(), b.1, b.3)).collect();
        bar_panel(&panels[0], "pp512 tok/s", &pp512)?;
        bar_panel(&panels[1], "tg128 tok/s", &tg128)
    })
    .map(Some)
}

/// What a figure's caption says of the host and the runs behind it.
struct Caption {
    machine: String,
    conditions: String,
}

impl Caption {
    /// None when there are no runs (no figure then).
    fn of<'a>(runs: impl Iterator<Item = &'a Run>) -> Option<Self> {
        let runs: Vec<&Run> = runs.collect();
        let first = runs.first()?;
        let host = &first.host;
        let machine = format!("{}, {} cores ({})", host.cpu, host.cores, host.features);
        let range = |values: Vec<f64>, unit: &str| {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(0.0, f64::max);
            match (format!("{lo:.1}"), format!("{hi:.1}")) {
                (lo, hi) if lo == hi => format!("{lo} {unit}"),
                (lo, hi) => format!("{lo}-{hi} {unit}"),
            }
        };
        let distinct = |values: Vec<String>| {
            let mut values = values;
            values.sort();
            values.dedup();
            values.join("/")
        };
        // The day, not the time: a figure's runs span minutes.
        let days = distinct(runs.iter().map(|r| day(&r.date)).collect());
        let threads = distinct(runs.iter().map(|r| r.threads.to_string()).collect());
        let counts = distinct(runs.iter().map(|r| r.runs.to_string()).collect());
        let bandwidth = range(runs.iter().map(|r| r.read_bandwidth_gb_s).collect(), "GB/s");
        let medians = match counts.as_str() {
            "1" => "one run each".to_string(),
            counts => format!("medians of {counts} runs"),
        };
        let conditions = format!(
            "kernels {}, read bandwidth {bandwidth}, {threads} threads, {medians}, {days}",
            host.kernels
        );
        Some(Caption {
            machine,
            conditions,
        })
    }
}

fn day(date: &str) -> String {
    date.split('T').next().unwrap_or(date).to_string()
}

const SIZE: (u32, u32) = (960, 560);
const FONT: &str = "sans-serif";

/// An SVG of `SIZE` with the title and the caption's two lines on top, `draw` filling the
/// rest.
fn svg(
    title: &str,
    caption: &Caption,
    draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<()>,
) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let area = root
            .titled(title, (FONT, 22))?
            .titled(&caption.machine, (FONT, 13))?
            .titled(&caption.conditions, (FONT, 13))?;
        draw(&area)?;
        root.present()?;
    }
    Ok(out)
}

/// Ours in blues and greens, llama.cpp's in oranges and reds: the side is seen at once.
fn color(kind: Kind, nth: usize) -> RGBColor {
    const OURS: [RGBColor; 3] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(23, 190, 207),
    ];
    const LLAMA: [RGBColor; 3] = [
        RGBColor(255, 127, 14),
        RGBColor(214, 39, 40),
        RGBColor(188, 189, 34),
    ];
    match kind {
        Kind::Ours => OURS[nth % OURS.len()],
        Kind::LlamaCpp => LLAMA[nth % LLAMA.len()],
    }
}

/// Ticks as whole numbers: tok/s and token counts, where "50.0" only adds noise (and a
/// tick between two whole numbers none, rather than a repeated one).
fn whole(value: &f64) -> String {
    match (value - value.round()).abs() < 1e-9 {
        true => format!("{value:.0}"),
        false => String::new(),
    }
}

/// Lines with a marker at every measured point, from y = 0 (a ratio is read off heights).
fn line_figure(
    title: &str,
    caption: &Caption,
    (x_desc, y_desc): (&str, &str),
    all: &[Series],
    legend: SeriesLabelPosition,
) -> Result<String> {
    let xs = all.iter().flat_map(|s| s.points.keys().copied());
    let x_max = xs.max().unwrap_or(1) as f64;
    let y_max = (all.iter().flat_map(|s| s.points.values().copied())).fold(0.0, f64::max);
    svg(title, caption, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max * 1.04, 0.0..y_max * 1.12)?;
        chart
            .configure_mesh()
            .light_line_style(TRANSPARENT)
            // At most one tick per whole x: stream counts are whole, depths round.
            .x_labels((x_max as usize + 1).min(10))
            .x_label_formatter(&whole)
            .y_label_formatter(&whole)
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style((FONT, 13))
            .draw()?;
        let mut nth = BTreeMap::<bool, usize>::new();
        for s in all {
            let counter = nth.entry(s.kind == Kind::Ours).or_default();
            let color = color(s.kind, *counter);
            *counter += 1;
            let points: Vec<(f64, f64)> = s.points.iter().map(|(&x, &y)| (x as f64, y)).collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(&s.label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(legend)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// Horizontal bars, one per `(label, kind, value)`, the first on top, the value at each
/// bar's end; labels sit on the y axis, where long names fit.
fn bar_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    bars: &[(&str, Kind, f64)],
) -> Result<()> {
    let n = bars.len();
    let max = bars.iter().map(|b| b.2).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(170)
        .build_cartesian_2d(0.0..max * 1.2, -0.5..n as f64 - 0.5)?;
    // Bar i at y = n - 1 - i, so the first is on top; a tick at each bar's centre only.
    let name = |y: &f64| {
        let i = n as f64 - 1.0 - y.round();
        let centred = (y - y.round()).abs() < 1e-6 && (0.0..n as f64).contains(&i);
        if centred {
            bars[i as usize].0.to_string()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .x_labels(6)
        .x_label_formatter(&whole)
        .y_labels(n)
        .y_label_formatter(&name)
        .label_style((FONT, 13))
        .draw()?;
    for (i, &(_, kind, value)) in bars.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        // One colour per side: the labels already name the weights.
        let color = color(kind, 0);
        let bar = Rectangle::new([(0.0, y - 0.35), (value, y + 0.35)], color.filled());
        let shown = if value < 100.0 {
            format!(" {value:.1}")
        } else {
            format!(" {value:.0}")
        };
        let text = Text::new(shown, (value, y + 0.05), (FONT, 13));
        chart.draw_series([bar])?;
        chart.draw_series([text])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str =
        r#""host":{"cpu":"Test CPU 9000","cores":2,"features":"avx2 fma","kernels":"avx2"}"#;

    fn decode(engine: &str, kind: &str, weights: &str, depth: usize, tg: f64) -> String {
        format!(
            r#"{{"engine":"{engine}","kind":"{kind}","threads":2,"runs":3,"load_s":0.2,"pp128_tok_s":500.0,"pp512_tok_s":900.0,"tg128_tok_s":{tg},"depth":{depth},"weights":{weights},"kv_cache":null,"matmul":null,"peak_rss_mb":300.0,"read_bandwidth_gb_s":28.0,{HOST},"date":"2026-11-25T06:40:12Z"}}"#
        )
    }

    fn stream(engine: &str, kind: &str, n: usize, tok_s: f64) -> String {
        format!(
            r#"{{"engine":"{engine}","kind":"{kind}","threads":2,"runs":3,"streams":{n},"aggregate_tok_s":{tok_s},"ttft_ms":40.0,"weights":null,"kv_cache":null,"matmul":null,"read_bandwidth_gb_s":27.5,{HOST},"date":"2026-11-25T07:00:00Z","load_average":3.5}}"#
        )
    }

    fn write(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    #[test]
    fn every_figure_names_both_sides_and_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = Vec::new();
        for (depth, ours, theirs) in [(0, 90.0, 60.0), (1024, 70.0, 50.0), (4000, 45.0, 33.0)] {
            lines.push(decode("flex", "ours", r#""bf16""#, depth, ours));
            lines.push(decode("llama.cpp bf16", "llama.cpp", "null", depth, theirs));
        }
        lines.push(decode("flex", "ours", r#""q8_0""#, 0, 110.0));
        for (n, ours, theirs) in [(1, 90.0, 60.0), (8, 440.0, 180.0)] {
            lines.push(stream("flex", "ours", n, ours));
            lines.push(stream("llama.cpp bf16", "llama.cpp", n, theirs));
        }
        let input = write(dir.path(), "bench.jsonl", &lines);
        let figures = dir.path().join("figures");
        let read = Lines::read(&[input]).unwrap();
        let written = write_figures(&read, &figures).unwrap();
        assert_eq!(written.len(), 3);
        for path in &written {
            let svg = std::fs::read_to_string(path).unwrap();
            for text in ["ours flex", "llama.cpp bf16", "Test CPU 9000", "2026-11-25"] {
                assert!(svg.contains(text), "{} lacks {text}", path.display());
            }
        }
        let depth = std::fs::read_to_string(figures.join("decode-vs-depth.svg")).unwrap();
        // The q8_0 row was measured at one depth: in the bars, not among the lines.
        assert!(!depth.contains("q8_0"));
        let bars = std::fs::read_to_string(figures.join("prompt-and-decode.svg")).unwrap();
        assert!(bars.contains("ours flex q8_0") && bars.contains("pp512"));
        let streams = std::fs::read_to_string(figures.join("streams.svg")).unwrap();
        assert!(streams.contains("27.5 GB/s"));
    }

    #[test]
    fn a_missing_field_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let line = decode("flex", "ours", "null", 0, 90.0).replace(r#""date":"#, r#""when":"#);
        let input = write(
            dir.path(),
            "old.jsonl",
            &[stream("flex", "ours", 1, 9.0), line],
        );
        let error = format!("{:#}", Lines::read(&[input]).unwrap_err());
        assert!(error.contains("old.jsonl line 2"), "{error}");
        assert!(error.contains("missing field `date`"), "{error}");
    }

    #[test]
    fn other_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let table = ["| engine | threads |".to_string()];
        let error = format!(
            "{:#}",
            Lines::read(&[write(dir.path(), "t.md", &table)]).unwrap_err()
        );
        assert!(
            error.contains("t.md line 1: not a JSON line of `bench`"),
            "{error}"
        );
        let empty = write(dir.path(), "empty.jsonl", &[]);
        let error = format!("{:#}", Lines::read(&[empty]).unwrap_err());
        assert!(error.contains("no JSON lines of `bench`"), "{error}");
        let other = [r#"{"name":"x"}"#.to_string()];
        let error = format!(
            "{:#}",
            Lines::read(&[write(dir.path(), "o.jsonl", &other)]).unwrap_err()
        );
        assert!(error.contains("missing field"), "{error}");
    }

    #[test]
    fn two_hosts_are_not_mixed() {
        let dir = tempfile::tempdir().unwrap();
        let other = decode("flex", "ours", "null", 0, 90.0).replace("Test CPU 9000", "Other");
        let lines = [decode("flex", "ours", "null", 0, 90.0), other];
        let error = format!(
            "{:#}",
            Lines::read(&[write(dir.path(), "h.jsonl", &lines)]).unwrap_err()
        );
        assert!(error.contains("two hosts"), "{error}");
    }
}
