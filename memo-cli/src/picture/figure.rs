//! The memory-timeline figure shared by `memo show --svg` and `memo solve --svg`: per column, an
//! arena panel (x = instruction or step or time, y = address, one rectangle per buffer over its
//! live range, horizontal lines for the arena size and the lower bound) above a live-bytes panel
//! (the bytes alive at each x, stacked by class), with one legend under all columns. Columns share
//! one byte scale so two plans compare at a glance.
//!
//! What is drawn at less than a pixel (a 32-layer 7B plan has about 3,000 device buffers):
//! - Buffers that sit back to back in the arena over the same live range, some of them thinner
//!   than [`THIN_PX`] (the model state: every parameter, its gradient and its optimizer state,
//!   interleaved, live over the whole step), are merged into one strip, split into one band per
//!   class in proportion to their bytes: the strip's extent is exact, the order inside it is
//!   schematic (said in the strip's tooltip).
//! - Rectangles narrower than [`MIN_WIDTH_PX`] (a transient living one or two instructions, or a
//!   buffer touched only by launches that take no time in the cost model) are drawn that wide, so
//!   they stay visible; a reader sees them, at worst half a pixel wider than they are.
//! - What is still under [`SKIP_HEIGHT_PX`] high after merging (scalars, token ids) is not drawn;
//!   the notes under the figure count those buffers and their bytes.
//! - The live-bytes panel keeps, per pixel column, the x where the total is highest, so the
//!   peak (which equals the lower bound) is never lost to sampling.

use super::axis;
use super::svg::{num, Anchor, Stroke, Svg};

/// A run of back-to-back buffers with one live range and a member thinner than this (pixels) is
/// merged into a strip.
pub const THIN_PX: f64 = 1.0;
/// Rectangles are drawn at least this wide (pixels).
pub const MIN_WIDTH_PX: f64 = 1.0;
/// Rectangles (or strips) lower than this (pixels) are not drawn, and are counted in the notes.
pub const SKIP_HEIGHT_PX: f64 = 0.05;

/// A colour class: what a rectangle or a band of the live panel is.
#[derive(Clone, Debug)]
pub struct Class {
    /// The legend text.
    pub name: String,
    /// An SVG colour (`#rrggbb`).
    pub colour: &'static str,
}

/// One buffer: `[offset, offset + bytes)` of the arena over `[x0, x1]` in x units.
#[derive(Clone, Debug)]
pub struct Block {
    /// Where its live range starts.
    pub x0: f64,
    /// Where its live range ends (at least `x0`).
    pub x1: f64,
    /// Arena offset in bytes.
    pub offset: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// Index into [`Figure::classes`].
    pub class: usize,
    /// The tooltip: what the buffer is, its size, place and live range.
    pub title: String,
    /// A short name written inside the rectangle when it is large enough (empty: none).
    pub label: String,
}

/// How a horizontal line is drawn and where its label goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LevelStyle {
    /// The arena size or the peak: solid, label at the right end above the line.
    Peak,
    /// The lower bound: dashed red, label at the right end below the line.
    LowerBound,
    /// The device's memory or a capacity: dotted, label in the middle above the line.
    Capacity,
    /// The peak of the live bytes (the lower bound) over the live panel: dashed red, label at
    /// the right end above the line (below it is the area being measured).
    LivePeak,
}

/// A labelled horizontal line at `bytes`.
#[derive(Clone, Debug)]
pub struct Level {
    /// Its height.
    pub bytes: u64,
    /// Its label (the figure appends the size).
    pub label: String,
    /// How it is drawn.
    pub style: LevelStyle,
}

/// The live bytes over `[x0, x1)` (a zero-width step is an instant), per class of
/// [`Figure::live_classes`].
#[derive(Clone, Debug)]
pub struct LiveStep {
    /// Start.
    pub x0: f64,
    /// End.
    pub x1: f64,
    /// Bytes alive per live class.
    pub by_class: Vec<u64>,
}

/// One plan or placement: a column of the figure.
#[derive(Clone, Debug)]
pub struct Column {
    /// The line above the column.
    pub heading: String,
    /// The end of the x axis.
    pub x_max: f64,
    /// The rectangles.
    pub blocks: Vec<Block>,
    /// The live bytes over x.
    pub live: Vec<LiveStep>,
    /// Lines across the arena panel.
    pub levels: Vec<Level>,
    /// Lines across the live panel.
    pub live_levels: Vec<Level>,
}

/// A whole figure.
#[derive(Clone, Debug)]
pub struct Figure {
    /// The line at the top.
    pub title: String,
    /// The x axis title ("instruction (issue order)", "simulated time (s)").
    pub x_label: String,
    /// The arena panel's y axis title.
    pub y_label: String,
    /// Rectangle colours by [`Block::class`].
    pub classes: Vec<Class>,
    /// Live-panel band colours by [`LiveStep::by_class`] index, bottom first.
    pub live_classes: Vec<Class>,
    /// What the legend lists.
    pub legend: Vec<Class>,
    /// The columns, left to right.
    pub columns: Vec<Column>,
    /// Extra lines of notes under the legend.
    pub notes: Vec<String>,
}

/// A rendered figure and what went into it.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The SVG text.
    pub svg: String,
    /// Rectangles drawn for buffers (a strip counts once per band).
    pub rectangles: usize,
    /// Buffers drawn inside merged strips.
    pub merged_buffers: usize,
    /// Buffers too small to draw.
    pub skipped_buffers: usize,
    /// Their bytes.
    pub skipped_bytes: u64,
}

const MARGIN_LEFT: f64 = 84.0;
const MARGIN_RIGHT: f64 = 28.0;
const COLUMN_GAP: f64 = 92.0;
const ARENA_TOP: f64 = 78.0;
const ARENA_HEIGHT: f64 = 420.0;
const LIVE_GAP: f64 = 58.0;
const LIVE_HEIGHT: f64 = 150.0;
const LEGEND_ROW: f64 = 22.0;
const NOTE_ROW: f64 = 16.0;
const GRID: &str = "#e4e4e4";
const AXIS: &str = "#444444";

/// Where a column's panels are on the page.
struct Frame {
    left: f64,
    width: f64,
    x_scale: f64,
    y_scale_arena: f64,
    y_scale_live: f64,
}

impl Frame {
    fn x(&self, value: f64) -> f64 {
        self.left + value * self.x_scale
    }
}

/// Draws `figure`. Never fails: empty columns give empty panels.
pub fn render(figure: &Figure) -> Rendered {
    let columns = figure.columns.len().max(1) as f64;
    let width = if columns > 1.0 { 760.0 * columns } else { 1200.0 };
    let column_width = (width - MARGIN_LEFT - MARGIN_RIGHT - COLUMN_GAP * (columns - 1.0)) / columns;
    let live_top = ARENA_TOP + ARENA_HEIGHT + LIVE_GAP;
    let legend_top = live_top + LIVE_HEIGHT + 58.0;
    let per_row = ((width - MARGIN_LEFT) / 190.0).floor().max(1.0) as usize;
    let legend_rows = figure.legend.len().div_ceil(per_row).max(1) as f64;
    let notes_top = legend_top + legend_rows * LEGEND_ROW + 6.0;

    // One byte scale for every column: the highest block, line or live total, with headroom.
    let mut y_max = 1u64;
    for column in &figure.columns {
        for block in &column.blocks {
            y_max = y_max.max(block.offset.saturating_add(block.bytes));
        }
        for level in column.levels.iter().chain(&column.live_levels) {
            y_max = y_max.max(level.bytes);
        }
        for step in &column.live {
            y_max = y_max.max(step.by_class.iter().fold(0u64, |a, &b| a.saturating_add(b)));
        }
    }
    let y_top = y_max as f64 * 1.06;

    let mut svg = Svg::new();
    svg.text(MARGIN_LEFT, 26.0, &figure.title, Anchor::Start, 15.0, true, false);
    let mut rendered =
        Rendered { svg: String::new(), rectangles: 0, merged_buffers: 0, skipped_buffers: 0, skipped_bytes: 0 };
    for (index, column) in figure.columns.iter().enumerate() {
        let left = MARGIN_LEFT + index as f64 * (column_width + COLUMN_GAP);
        let frame = Frame {
            left,
            width: column_width,
            x_scale: if column.x_max > 0.0 { column_width / column.x_max } else { 0.0 },
            y_scale_arena: ARENA_HEIGHT / y_top,
            y_scale_live: LIVE_HEIGHT / y_top,
        };
        svg.text(left, ARENA_TOP - 14.0, &column.heading, Anchor::Start, 12.5, true, false);
        let arena_bottom = ARENA_TOP + ARENA_HEIGHT;
        axes(&mut svg, &frame, ARENA_TOP, ARENA_HEIGHT, y_max, column.x_max, &figure.y_label, None);
        let clip = format!("arena{index}");
        svg.clip_rect(&clip, left, ARENA_TOP, column_width, ARENA_HEIGHT);
        svg.open_group(Some("buffers"), Some(&clip), true);
        let labels = draw_blocks(&mut svg, &frame, arena_bottom, figure, column, &mut rendered);
        svg.close_group();
        for (x, y, label) in labels {
            svg.text(x, y, &label, Anchor::Middle, 11.0, false, true);
        }
        levels(&mut svg, &frame, arena_bottom, frame.y_scale_arena, &column.levels);

        let live_bottom = live_top + LIVE_HEIGHT;
        axes(&mut svg, &frame, live_top, LIVE_HEIGHT, y_max, column.x_max, "live bytes", Some(&figure.x_label));
        svg.open_group(Some("live"), None, true);
        draw_live(&mut svg, &frame, live_bottom, figure, column);
        svg.close_group();
        levels(&mut svg, &frame, live_bottom, frame.y_scale_live, &column.live_levels);
    }
    legend(&mut svg, figure, legend_top, per_row);
    let chars_per_line = ((width - MARGIN_LEFT - MARGIN_RIGHT) / 6.3).floor().max(40.0) as usize;
    let mut notes = Vec::new();
    for note in figure.notes.iter().cloned().chain([drawing_note(&rendered)]) {
        notes.extend(wrap(&note, chars_per_line));
    }
    for (i, note) in notes.iter().enumerate() {
        svg.text(MARGIN_LEFT, notes_top + (i as f64 + 0.7) * NOTE_ROW, note, Anchor::Start, 11.0, false, false);
    }
    let height = notes_top + notes.len() as f64 * NOTE_ROW + 12.0;
    rendered.svg = svg.finish(width, height, &figure.title);
    rendered
}

/// `text` broken at spaces into lines of at most `width` characters (longer words stand alone).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// What the drawing simplified, in one line under the figure.
fn drawing_note(rendered: &Rendered) -> String {
    let mut note = format!("Rectangles narrower than {} px are drawn {} px wide", num(MIN_WIDTH_PX), num(MIN_WIDTH_PX));
    if rendered.merged_buffers > 0 {
        note.push_str(&format!(
            "; {} buffers back to back with the same live range, some thinner than {} px, are merged into \
             strips (one band per kind, by bytes)",
            rendered.merged_buffers,
            num(THIN_PX)
        ));
    }
    if rendered.skipped_buffers > 0 {
        note.push_str(&format!(
            "; {} buffer(s) under {} px high ({} in all) not drawn",
            rendered.skipped_buffers,
            num(SKIP_HEIGHT_PX),
            axis::bytes_label(rendered.skipped_bytes)
        ));
    }
    note.push('.');
    note
}

/// Grid, ticks, tick labels and axis titles of one panel.
#[allow(clippy::too_many_arguments)]
fn axes(
    svg: &mut Svg,
    frame: &Frame,
    top: f64,
    height: f64,
    y_max: u64,
    x_max: f64,
    y_label: &str,
    x_label: Option<&str>,
) {
    let bottom = top + height;
    let y_scale = height / (y_max as f64 * 1.06);
    let tick_count = if height > 200.0 { 6 } else { 3 };
    let thin = Stroke { colour: GRID, width: 1.0, dash: None };
    for (value, label) in axis::byte_ticks(y_max, tick_count) {
        let y = bottom - value * y_scale;
        svg.line(frame.left, y, frame.left + frame.width, y, thin);
        svg.text(frame.left - 6.0, y + 4.0, &label, Anchor::End, 11.0, false, false);
    }
    let axis_stroke = Stroke { colour: AXIS, width: 1.0, dash: None };
    let target = ((frame.width / 110.0).floor() as usize).max(2);
    for (value, label) in axis::linear_ticks(x_max, target) {
        let x = frame.x(value);
        svg.line(x, bottom, x, bottom + 4.0, axis_stroke);
        svg.text(x, bottom + 16.0, &label, Anchor::Middle, 11.0, false, false);
    }
    svg.line(frame.left, top, frame.left, bottom, axis_stroke);
    svg.line(frame.left, bottom, frame.left + frame.width, bottom, axis_stroke);
    svg.vertical_text(frame.left - 62.0, top + height / 2.0, y_label);
    if let Some(x_label) = x_label {
        svg.text(frame.left + frame.width / 2.0, bottom + 34.0, x_label, Anchor::Middle, 12.0, false, false);
    }
}

/// A rectangle in pixels, ready to draw.
struct PixelRect {
    x: f64,
    width: f64,
    first: usize,
    end: usize,
}

/// Draws the column's rectangles; returns the labels that fit inside them (drawn after, outside
/// the crisp-edged group, so the text stays smooth).
fn draw_blocks(
    svg: &mut Svg,
    frame: &Frame,
    bottom: f64,
    figure: &Figure,
    column: &Column,
    out: &mut Rendered,
) -> Vec<(f64, f64, String)> {
    let mut labels = Vec::new();
    let mut order: Vec<usize> = (0..column.blocks.len()).collect();
    let blocks = &column.blocks;
    order.sort_by(|&a, &b| {
        let (p, q) = (&blocks[a], &blocks[b]);
        p.x0.total_cmp(&q.x0).then(p.x1.total_cmp(&q.x1)).then(p.offset.cmp(&q.offset)).then(a.cmp(&b))
    });
    let bytes_per_px = 1.0 / frame.y_scale_arena;
    let thin = |b: &Block| (b.bytes as f64) < THIN_PX * bytes_per_px;
    // Runs of blocks back to back in the arena with the same live range; a run with a thin member
    // becomes one strip, any other run is drawn block by block.
    let mut runs: Vec<PixelRect> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let head = &blocks[order[i]];
        let mut j = i + 1;
        let mut end = head.offset.saturating_add(head.bytes);
        let mut any_thin = thin(head);
        while j < order.len() {
            let next = &blocks[order[j]];
            let gap = next.offset.saturating_sub(end) as f64;
            if next.x0 != head.x0 || next.x1 != head.x1 || next.offset < end || gap > 0.5 * bytes_per_px {
                break;
            }
            any_thin |= thin(next);
            end = next.offset.saturating_add(next.bytes);
            j += 1;
        }
        let x = frame.x(head.x0);
        let width = ((head.x1 - head.x0) * frame.x_scale).max(MIN_WIDTH_PX);
        if any_thin && j - i > 1 {
            runs.push(PixelRect { x, width, first: i, end: j });
        } else {
            runs.extend((i..j).map(|k| PixelRect { x, width, first: k, end: k + 1 }));
        }
        i = j;
    }
    for run in runs {
        let members = &order[run.first..run.end];
        let first = &blocks[members[0]];
        let last = &blocks[members[members.len() - 1]];
        let low = first.offset;
        let high = last.offset.saturating_add(last.bytes);
        let total: u64 = members.iter().fold(0u64, |a, &m| a.saturating_add(blocks[m].bytes));
        if (high - low) as f64 * frame.y_scale_arena < SKIP_HEIGHT_PX {
            out.skipped_buffers += members.len();
            out.skipped_bytes = out.skipped_bytes.saturating_add(total);
            continue;
        }
        if members.len() == 1 {
            let y = bottom - high as f64 * frame.y_scale_arena;
            let h = first.bytes as f64 * frame.y_scale_arena;
            let colour = figure.classes.get(first.class).map_or("#999999", |c| c.colour);
            svg.rect(run.x, y, run.width, h, colour, Some("buffer"), Some(&first.title));
            // About 7 px per character at 11 px.
            let fits = run.width >= 7.0 * first.label.chars().count() as f64 + 8.0 && h >= 15.0;
            if !first.label.is_empty() && fits {
                labels.push((run.x + run.width / 2.0, y + h / 2.0 + 4.0, first.label.clone()));
            }
            out.rectangles += 1;
            continue;
        }
        // A strip: one band per class, in class order, sized by bytes, over [low, high).
        let mut by_class = vec![(0u64, 0usize); figure.classes.len()];
        for &m in members {
            if let Some(slot) = by_class.get_mut(blocks[m].class) {
                slot.0 = slot.0.saturating_add(blocks[m].bytes);
                slot.1 += 1;
            }
        }
        let span = (high - low) as f64;
        let contents: Vec<String> = by_class
            .iter()
            .enumerate()
            .filter(|(_, (bytes, _))| *bytes > 0)
            .map(|(c, (bytes, n))| format!("{n} {} ({})", figure.classes[c].name, axis::bytes_label(*bytes)))
            .collect();
        let title = format!(
            "{} buffers back to back at {} .. {}, live over the same range ({} .. {}): {}; drawn as one band per \
             kind in proportion to its bytes (their order inside the strip is interleaved)",
            members.len(),
            axis::bytes_label(low),
            axis::bytes_label(high),
            num(first.x0),
            num(first.x1),
            contents.join(", ")
        );
        let mut below = low as f64;
        for (c, (bytes, _)) in by_class.iter().enumerate() {
            if *bytes == 0 {
                continue;
            }
            let share = span * (*bytes as f64 / total.max(1) as f64);
            let y = bottom - (below + share) * frame.y_scale_arena;
            svg.rect(
                run.x,
                y,
                run.width,
                share * frame.y_scale_arena,
                figure.classes[c].colour,
                Some("strip"),
                Some(&title),
            );
            out.rectangles += 1;
            below += share;
        }
        out.merged_buffers += members.len();
    }
    labels
}

/// The live-bytes panel: per pixel column, the step with the highest total, stacked by class.
fn draw_live(svg: &mut Svg, frame: &Frame, bottom: f64, figure: &Figure, column: &Column) {
    let pixels = frame.width.ceil().max(1.0) as usize;
    let mut best: Vec<Option<(u64, usize)>> = vec![None; pixels];
    for (index, step) in column.live.iter().enumerate() {
        let total = step.by_class.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let px0 = (step.x0 * frame.x_scale).max(0.0);
        let px1 = (step.x1 * frame.x_scale).max(px0);
        let first = (px0.floor() as usize).min(pixels - 1);
        let last = ((px1.ceil() as usize).saturating_sub(1)).clamp(first, pixels - 1);
        for slot in &mut best[first..=last] {
            if slot.is_none_or(|(t, _)| total > t) {
                *slot = Some((total, index));
            }
        }
    }
    let classes = figure.live_classes.len();
    // Cumulative bands from the top class down, each drawn over the ones above it.
    for k in (0..classes).rev() {
        let height_at = |pixel: usize| -> u64 {
            best[pixel].map_or(0, |(_, index)| {
                column.live[index].by_class.iter().take(k + 1).fold(0u64, |a, &b| a.saturating_add(b))
            })
        };
        if (0..pixels)
            .all(|p| best[p].is_none_or(|(_, index)| column.live[index].by_class.get(k).copied().unwrap_or(0) == 0))
        {
            continue;
        }
        let mut d = format!("M{} {}", num(frame.left), num(bottom));
        let mut previous: Option<u64> = None;
        for pixel in 0..pixels {
            let value = height_at(pixel);
            if previous != Some(value) {
                let x = frame.left + pixel as f64;
                let y = bottom - value as f64 * frame.y_scale_live;
                if previous.is_some() {
                    d.push_str(&format!("H{}", num(x)));
                }
                d.push_str(&format!("V{}", num(y)));
                previous = Some(value);
            }
        }
        d.push_str(&format!("H{}V{}Z", num(frame.left + frame.width), num(bottom)));
        svg.path(&d, figure.live_classes[k].colour, Some("live-bytes"));
    }
}

fn levels(svg: &mut Svg, frame: &Frame, bottom: f64, y_scale: f64, levels: &[Level]) {
    for level in levels {
        let y = bottom - level.bytes as f64 * y_scale;
        let (stroke, x, anchor, dy) = match level.style {
            LevelStyle::Peak => (
                Stroke { colour: "#111111", width: 1.4, dash: None },
                frame.left + frame.width - 4.0,
                Anchor::End,
                -5.0,
            ),
            LevelStyle::LowerBound => (
                Stroke { colour: "#c0392b", width: 1.4, dash: Some("6 4") },
                frame.left + frame.width - 4.0,
                Anchor::End,
                14.0,
            ),
            LevelStyle::LivePeak => (
                Stroke { colour: "#c0392b", width: 1.4, dash: Some("6 4") },
                frame.left + frame.width - 4.0,
                Anchor::End,
                -5.0,
            ),
            LevelStyle::Capacity => (
                Stroke { colour: "#555555", width: 1.2, dash: Some("2 3") },
                frame.left + frame.width / 2.0,
                Anchor::Middle,
                -5.0,
            ),
        };
        svg.line(frame.left, y, frame.left + frame.width, y, stroke);
        let text = format!("{} {}", level.label, axis::bytes_label(level.bytes));
        svg.text(x, y + dy, &text, anchor, 11.0, false, true);
    }
}

fn legend(svg: &mut Svg, figure: &Figure, top: f64, per_row: usize) {
    for (i, class) in figure.legend.iter().enumerate() {
        let x = MARGIN_LEFT + (i % per_row) as f64 * 190.0;
        let y = top + (i / per_row) as f64 * LEGEND_ROW;
        svg.rect(x, y, 14.0, 14.0, class.colour, Some("legend"), None);
        svg.text(x + 20.0, y + 11.5, &class.name, Anchor::Start, 12.0, false, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(x0: f64, x1: f64, offset: u64, bytes: u64, class: usize) -> Block {
        Block { x0, x1, offset, bytes, class, title: format!("{offset}"), label: String::new() }
    }

    fn figure(blocks: Vec<Block>) -> Figure {
        let classes: Vec<Class> = ["#000001", "#000002"]
            .iter()
            .enumerate()
            .map(|(i, c)| Class { name: format!("k{i}"), colour: c })
            .collect();
        let live = vec![LiveStep { x0: 0.0, x1: 10.0, by_class: vec![1, 1] }];
        let column = Column { heading: "h".into(), x_max: 10.0, blocks, live, levels: vec![], live_levels: vec![] };
        Figure {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            classes: classes.clone(),
            live_classes: classes.clone(),
            legend: classes,
            columns: vec![column],
            notes: vec![],
        }
    }

    /// With 1,000,000 bytes on 420 px, a pixel is about 2,500 bytes: three thin neighbours with one
    /// live range become one strip (two bands, one per class), a thick block stands alone, a
    /// 10-byte block elsewhere is too small to draw.
    #[test]
    fn thin_neighbours_merge_and_specks_are_counted() {
        let blocks = vec![
            block(0.0, 10.0, 0, 1000, 0),
            block(0.0, 10.0, 1000, 1000, 1),
            block(0.0, 10.0, 2000, 1000, 0),
            block(2.0, 4.0, 10_000, 990_000, 1),
            block(5.0, 6.0, 5_000, 10, 0),
        ];
        let rendered = render(&figure(blocks));
        assert_eq!(rendered.svg.matches("class=\"strip\"").count(), 2);
        assert_eq!(rendered.svg.matches("class=\"buffer\"").count(), 1);
        assert_eq!((rendered.rectangles, rendered.merged_buffers, rendered.skipped_buffers), (3, 3, 1));
        assert_eq!(rendered.skipped_bytes, 10);
        assert!(rendered.svg.contains("3 buffers back to back"));
    }

    /// Neighbours with different live ranges, or a gap of more than half a pixel, stay apart.
    #[test]
    fn different_ranges_or_gaps_do_not_merge() {
        let blocks =
            vec![block(0.0, 10.0, 0, 2000, 0), block(0.0, 9.0, 2000, 2000, 0), block(0.0, 10.0, 6000, 2000, 0)];
        let rendered = render(&figure(blocks));
        assert_eq!(rendered.svg.matches("class=\"buffer\"").count(), 3);
        assert_eq!(rendered.merged_buffers, 0);
    }

    #[test]
    fn notes_wrap_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
        assert_eq!(wrap("averylongword b", 4), ["averylongword", "b"]);
        assert!(wrap("", 10).is_empty());
    }
}
