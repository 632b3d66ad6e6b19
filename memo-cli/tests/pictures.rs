//! `memo show --svg/--chrome-trace` and `memo solve --svg`, run as a user runs them: the SVGs are
//! rendered to pixels with resvg (a Rust renderer, no browser) and must show what they claim; the
//! trace must be valid Chrome trace-event JSON.
//!
//! The README's picture is made by `readme_picture` (ignored; see its doc comment).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{assert_fails, code, memo, scratch, stderr};
use resvg::tiny_skia::{Pixmap, Transform};
use resvg::usvg;
use serde_json::Value;

/// A 4-layer model with a small hidden size: every kind of buffer, a few hundred of them.
const SMALL: [&str; 14] = [
    "--model",
    "7b",
    "--layers",
    "4",
    "--hidden",
    "256",
    "--heads",
    "4",
    "--seq",
    "4K",
    "--machine",
    "a800x8",
    "--tp",
    "1",
];

/// Colours of `memo-cli/src/picture/plan.rs`, by kind.
const KIND_COLOURS: [(&str, [u8; 3]); 6] = [
    ("optimizer state", [0x1f, 0x3f, 0x7a]),
    ("parameter", [0x3d, 0x7c, 0xc9]),
    ("rounding buffer", [0xe0, 0x8a, 0x1e]),
    ("skeletal", [0xd1, 0x49, 0x5b]),
    ("cross-layer", [0x8e, 0x5e, 0xa2]),
    ("transient", [0x2a, 0x9d, 0x8f]),
];

/// The layout of `memo-cli/src/picture/figure.rs`, in SVG pixels: the arena panel's and the live
/// panel's vertical extents.
const ARENA_ROWS: std::ops::Range<u32> = 78..498;
const LIVE_ROWS: std::ops::Range<u32> = 556..706;

fn plan_file(strategy: &str, extra: &[&str], file: &str) -> String {
    let path = scratch(file, b"");
    plan_into(strategy, extra, path.to_str().unwrap())
}

/// Plans `strategy` into `path` (a plan that does not fit the machine is still written).
fn plan_into(strategy: &str, extra: &[&str], path: &str) -> String {
    let mut args = vec!["plan"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--strategy", strategy, "-o", path]);
    let output = memo(&args, None);
    assert!(code(&output) == 0 || code(&output) == 5, "{}", stderr(&output));
    path.to_string()
}

fn json(output: &std::process::Output) -> Value {
    assert_eq!(code(output), 0, "{}", stderr(output));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// Renders SVG text with resvg at `scale`. Labels are drawn only with the `readme-picture`
/// feature (resvg's text stack, with DejaVu Sans from the machine); the checks here do not
/// depend on text.
fn render(svg: &str, scale: f32) -> Pixmap {
    #[allow(unused_mut)]
    let mut options = usvg::Options::default();
    #[cfg(feature = "readme-picture")]
    {
        let fonts = ["/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/TTF", "/usr/share/fonts/dejavu"];
        for dir in fonts {
            for file in ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf"] {
                if let Ok(bytes) = std::fs::read(Path::new(dir).join(file)) {
                    options.fontdb_mut().load_font_data(bytes);
                }
            }
        }
        options.fontdb_mut().set_sans_serif_family("DejaVu Sans");
        options.font_family = "DejaVu Sans".to_string();
    }
    let tree = usvg::Tree::from_str(svg, &options).expect("the SVG parses");
    let size = tree.size();
    let (w, h) = ((size.width() * scale).ceil() as u32, (size.height() * scale).ceil() as u32);
    let mut pixmap = Pixmap::new(w, h).expect("a non-empty picture");
    resvg::render(&tree, Transform::from_scale(scale, scale), &mut pixmap.as_mut());
    pixmap
}

/// Pixels of each exact colour in rows `rows` (opaque pixels, so premultiplied = straight).
fn colours(pixmap: &Pixmap, rows: std::ops::Range<u32>) -> BTreeMap<[u8; 3], usize> {
    let mut counts = BTreeMap::new();
    let width = pixmap.width() as usize;
    for (i, px) in pixmap.data().chunks_exact(4).enumerate() {
        let row = (i / width) as u32;
        if rows.contains(&row) && px[3] == 255 {
            *counts.entry([px[0], px[1], px[2]]).or_insert(0) += 1;
        }
    }
    counts
}

fn count(svg: &str, needle: &str) -> usize {
    svg.matches(needle).count()
}

/// Device buffers a plan uses, by the live-range rule of spec/validity.md, from its JSON dump:
/// persistent kinds and inputs always, others when an instruction touches them.
fn used_device_buffers(plan: &str) -> usize {
    let dump = json(&memo(&["show", plan, "--dump-json"], None));
    let mut touched = std::collections::BTreeSet::new();
    for instruction in dump["instructions"].as_array().unwrap() {
        if let Some(args) = instruction["launch"]["args"].as_array() {
            touched.extend(args.iter().map(|a| a["buffer"].as_u64().unwrap()));
        }
        for side in ["src", "dst"] {
            if let Some(buffer) = instruction["copy"][side]["buffer"].as_u64() {
                touched.insert(buffer);
            }
        }
    }
    let always = ["parameter", "gradient", "optimizer_state", "scalar", "input"];
    dump["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["place"]["space"] == "device")
        .filter(|b| always.contains(&b["kind"].as_str().unwrap()) || touched.contains(&b["index"].as_u64().unwrap()))
        .count()
}

#[test]
fn a_plan_picture_shows_every_buffer_both_panels_and_the_kinds_in_colour() {
    let plan = plan_file("memo", &SMALL, "pic-small-memo.memo");
    let svg_path = scratch("pic-small-memo.svg", b"");
    let svg_path = svg_path.to_str().unwrap();
    let summary = json(&memo(&["show", &plan, "--svg", svg_path, "--json"], None));
    let svg = std::fs::read_to_string(svg_path).unwrap();
    assert_eq!(summary["svg"]["bytes"].as_u64().unwrap() as usize, svg.len());

    // Every used device buffer is a rectangle of its own, a band of a merged strip, or counted as
    // too small to draw: nothing is lost silently.
    let singles = count(&svg, "class=\"buffer\"");
    let merged = summary["svg"]["merged_buffers"].as_u64().unwrap() as usize;
    let skipped = summary["svg"]["skipped_buffers"].as_u64().unwrap() as usize;
    assert_eq!(singles + count(&svg, "class=\"strip\""), summary["svg"]["rectangles"].as_u64().unwrap() as usize);
    assert_eq!(singles + merged + skipped, used_device_buffers(&plan), "{singles} + {merged} + {skipped}");
    assert!(singles > 50, "{singles}");
    // The scalars (4 bytes each) are too small to draw, and the notes say so.
    assert!(skipped >= 2 && svg.contains("not drawn"), "{skipped}");
    assert_eq!(count(&svg, "class=\"buffers\""), 1);
    assert!(count(&svg, "class=\"live-bytes\"") >= 4, "one band per kind present");
    for line in ["arena ", "lower bound ", "lower bound = peak live "] {
        assert!(svg.contains(&format!(">{line}")), "{line}");
    }
    assert!(svg.contains(">instruction (issue order)</text>") && svg.contains(">arena address</text>"));

    let pixmap = render(&svg, 1.0);
    let arena = colours(&pixmap, ARENA_ROWS);
    let live = colours(&pixmap, LIVE_ROWS);
    // A memo plan keeps no per-layer skeletal tensors (they live in the rounding buffers).
    for (kind, colour) in KIND_COLOURS.iter().filter(|(kind, _)| *kind != "skeletal") {
        assert!(arena.get(colour).copied().unwrap_or(0) >= 20, "{kind} missing from the arena panel");
    }
    let live_kinds = KIND_COLOURS.iter().filter(|(_, c)| live.get(c).copied().unwrap_or(0) >= 20).count();
    assert!(live_kinds >= 4, "the live panel shows {live_kinds} kinds");
    // Non-trivial: many distinct colours in all (kinds, antialiasing, text).
    assert!(colours(&pixmap, 0..pixmap.height()).len() >= 20);
}

#[test]
fn a_time_axis_picture_and_a_comparison_share_one_scale() {
    let memo_plan = plan_file("memo", &SMALL, "pic-cmp-memo.memo");
    let keep_all = plan_file("keep-all", &SMALL, "pic-cmp-keep-all.memo");
    let path = scratch("pic-cmp.svg", b"");
    let path = path.to_str().unwrap();
    let output = memo(&["show", &keep_all, "--svg", path, "--compare", &memo_plan, "--x", "time"], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains(&format!("wrote {path}: ")), "{text}");
    let svg = std::fs::read_to_string(path).unwrap();
    assert!(svg.contains(">keep-all: arena ") && svg.contains(">memo: arena "));
    assert!(svg.contains(">simulated time (s)"));
    assert_eq!(count(&svg, "class=\"buffers\""), 2);
    // One byte scale: both columns have the same y tick labels (each label appears an even number
    // of times: once per column, in each of the two panels where it fits).
    let mut ticks: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, _) in svg.match_indices("</text>") {
        let label = &svg[svg[..i].rfind('>').unwrap() + 1..i];
        let unit = label.rsplit(' ').next().unwrap();
        if label.starts_with(|c: char| c.is_ascii_digit()) && ["B", "KiB", "MiB", "GiB"].contains(&unit) {
            *ticks.entry(label).or_insert(0) += 1;
        }
    }
    assert!(ticks.len() >= 4 && ticks.values().all(|n| n % 2 == 0), "{ticks:?}");
    let pixmap = render(&svg, 1.0);
    assert!(pixmap.width() > 1400, "two columns");
    let left =
        colours(&pixmap.clone_rect(resvg::tiny_skia::IntRect::from_xywh(0, 0, 760, 706).unwrap()).unwrap(), ARENA_ROWS);
    let right = colours(
        &pixmap.clone_rect(resvg::tiny_skia::IntRect::from_xywh(760, 0, 760, 706).unwrap()).unwrap(),
        ARENA_ROWS,
    );
    let skeletal = [0xd1, 0x49, 0x5b];
    let rounding = [0xe0, 0x8a, 0x1e];
    assert!(left.get(&skeletal).copied().unwrap_or(0) > 100, "keep-all keeps skeletal tensors");
    assert!(right.get(&rounding).copied().unwrap_or(0) > 20, "memo uses rounding buffers");
    assert_eq!(right.get(&skeletal), None, "memo keeps no per-layer skeletal tensors");
}

/// Required fields and types per event (the trace-event format's JSON object form).
fn validate_trace_events(trace: &Value) -> Vec<&Value> {
    let events = trace["traceEvents"].as_array().expect("a traceEvents array");
    let mut last_ts: BTreeMap<u64, f64> = BTreeMap::new();
    for event in events {
        let ph = event["ph"].as_str().unwrap_or_else(|| panic!("ph: {event}"));
        assert!(event["name"].is_string(), "{event}");
        assert!(event["pid"].is_u64() && event["tid"].is_u64(), "{event}");
        match ph {
            "M" => assert!(event["args"].is_object(), "{event}"),
            "X" | "i" | "C" => {
                let ts = event["ts"].as_f64().unwrap_or_else(|| panic!("ts: {event}"));
                assert!(ts >= 0.0, "{event}");
                if ph == "X" {
                    assert!(event["dur"].as_f64().unwrap_or_else(|| panic!("dur: {event}")) >= 0.0, "{event}");
                }
                if ph == "i" {
                    assert!(["g", "p", "t"].contains(&event["s"].as_str().unwrap()), "{event}");
                }
                if ph == "C" {
                    assert!(event["args"].as_object().unwrap().values().all(Value::is_number), "{event}");
                }
                let tid = event["tid"].as_u64().unwrap();
                let previous = last_ts.insert(tid, ts).unwrap_or(0.0);
                assert!(ts >= previous, "ts goes back on tid {tid}: {previous} then {event}");
            }
            other => panic!("unexpected phase {other}: {event}"),
        }
    }
    events.iter().collect()
}

#[test]
fn the_chrome_trace_is_valid_trace_event_json_with_every_instruction() {
    let plan = plan_file("memo", &SMALL, "pic-trace-memo.memo");
    let path = scratch("pic-trace.json", b"");
    let path = path.to_str().unwrap();
    let summary = json(&memo(&["show", &plan, "--chrome-trace", path, "--json"], None));
    let trace: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let events = validate_trace_events(&trace);
    let instructions = summary["instructions"].as_u64().unwrap() as usize;
    let of_instructions = events.iter().filter(|e| e["args"]["instruction"].is_u64()).count();
    assert_eq!(of_instructions, instructions, "one event per instruction");
    let threads: Vec<&str> =
        events.iter().filter(|e| e["name"] == "thread_name").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    assert_eq!(
        threads,
        ["compute", "d2h (device to host)", "h2d (host to device)", "collective (tensor-parallel group)"]
    );
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    for prefix in [
        "layer 0 linear",
        "layer 1 attention_backward",
        "copy layer 0 layer_input (d2h)",
        "copy layer 0 layer_input (h2d)",
        "wait e",
    ] {
        assert!(names.iter().any(|n| n.starts_with(prefix)), "no {prefix:?} event");
    }
    // Memo recomputes the token-split rows of the swapped layers only; the last two keep theirs.
    assert!(names.contains(&"recompute layer 1 linear") && names.contains(&"recompute layer 0 layer_norm"));
    assert!(!names.iter().any(|n| n.starts_with("recompute layer 2") || n.starts_with("recompute layer 3")));
    let category = |name: &str| events.iter().find(|e| e["name"] == name).map(|e| e["cat"].clone()).unwrap();
    assert_eq!(category("layer 3 linear_backward_input"), "backward");
    assert_eq!(category("layer 0 attention"), "forward");
    // The slowest stream's end is the simulated step time.
    let end = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let step_us = summary["step_time_s"].as_f64().unwrap() * 1e6;
    assert!((end - step_us).abs() <= 1e-3 * step_us.max(1.0), "{end} vs {step_us}");
    let flops: u64 = events.iter().filter_map(|e| e["args"]["flops"].as_u64()).sum();
    assert!(flops > 0);
    let peak = events
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["args"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum::<u64>())
        .max()
        .unwrap();
    assert!(peak > 0 && peak <= summary["arena_bytes"].as_u64().unwrap() * 2);
}

#[test]
fn a_placement_picture_has_one_rectangle_per_buffer_and_its_lines() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/traces/memo-layer.trace");
    let path = scratch("pic-placement.svg", b"");
    let path = path.to_str().unwrap();
    let output = memo(&["solve", trace, "--svg", path, "--json"], None);
    let solved = json(&output);
    assert_eq!(solved["svg"], path);
    let svg = std::fs::read_to_string(path).unwrap();
    assert_eq!(count(&svg, "class=\"buffer\""), solved["buffers"].as_u64().unwrap() as usize);
    assert!(svg.contains(">peak 2.26 GiB</text>") && svg.contains(">lower bound 2.26 GiB</text>"), "2432 MB");
    assert!(svg.contains(">step (trace order)</text>"));
    let pixmap = render(&svg, 1.0);
    let arena = colours(&pixmap, ARENA_ROWS);
    let palette = [[0x3d, 0x7c, 0xc9], [0xe0, 0x8a, 0x1e], [0x2a, 0x9d, 0x8f], [0xd1, 0x49, 0x5b]];
    assert!(palette.iter().all(|c| arena.get(c).copied().unwrap_or(0) > 100), "distinct buffers in distinct colours");
    assert!(colours(&pixmap, LIVE_ROWS).get(&[0x5a, 0x6b, 0x7d]).copied().unwrap_or(0) > 1000, "the live panel");
}

#[test]
fn picture_errors_say_what_to_do() {
    let plan = plan_file("memo", &SMALL, "pic-err-memo.memo");
    let message = assert_fails(&memo(&["show", &plan, "--compare", &plan], None), 2);
    assert!(message.contains("--svg") && message.contains("memo show --help"), "{message}");
    let message = assert_fails(&memo(&["show", &plan, "--svg", "x.svg", "--x", "seconds"], None), 2);
    assert!(message.contains("index") && message.contains("time"), "{message}");
    let message = assert_fails(&memo(&["show", &plan, "--svg", "/nonexistent-dir/m.svg"], None), 1);
    assert!(message.contains("/nonexistent-dir/m.svg") && message.contains("directory exists"), "{message}");
    let missing = scratch("pic-missing.memo", b"not a plan");
    let message = assert_fails(
        &memo(&["show", &plan, "--svg", "/tmp/never.svg", "--compare", missing.to_str().unwrap()], None),
        2,
    );
    assert!(message.contains("pic-missing.memo"), "{message}");
    assert!(!Path::new("/tmp/never.svg").exists(), "nothing is written when the comparison plan is bad");
}

/// The README's picture's setting: keep-all and memo for the 7B model at 128K tokens on 8 A800
/// with t = 8.
const README_SETTING: [&str; 8] = ["--model", "7b", "--seq", "128K", "--machine", "a800x8", "--tp", "8"];

/// The PNG text chunk (`tEXt`) that records the headings the README's picture shows, so a test
/// can tell when the plans it pictures have changed and the picture has not.
const HEADINGS_KEY: &str = "memo-headings";

/// Plans the README's setting into `dir` (the file names appear in the column headings) and
/// returns the side-by-side SVG `memo show --svg --compare` draws of them.
fn readme_svg(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let keep_all = plan_into("keep-all", &README_SETTING, dir.join("keep-all.memo").to_str().unwrap());
    let memo_plan = plan_into("memo", &README_SETTING, dir.join("memo.memo").to_str().unwrap());
    let svg_path = dir.join("memory-timeline.svg");
    let svg_path = svg_path.to_str().unwrap();
    let output = memo(&["show", &keep_all, "--svg", svg_path, "--compare", &memo_plan], None);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    std::fs::read_to_string(svg_path).unwrap()
}

/// The bold texts of a picture, one per line: its title and each panel's heading, which carry
/// the model, the setting, each arena, lower bound and host slab.
fn headings(svg: &str) -> String {
    let mut found = Vec::new();
    for piece in svg.split("<text ").skip(1) {
        let Some((attributes, rest)) = piece.split_once('>') else { continue };
        if attributes.contains("font-weight=\"bold\"") {
            found.push(rest.split('<').next().unwrap_or("").to_string());
        }
    }
    found.join("\n")
}

/// PNG's chunk checksum: CRC-32 of the chunk's type and data.
fn png_crc(bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(bytes);
    hasher.finalize()
}

/// `png` with a `tEXt` chunk `key`=`text` before its closing `IEND` chunk.
#[cfg(feature = "readme-picture")]
fn with_text_chunk(png: &[u8], key: &str, text: &str) -> Vec<u8> {
    let iend = png.len() - 12; // length (4), "IEND", no data, CRC (4)
    let mut body = b"tEXt".to_vec();
    body.extend_from_slice(key.as_bytes());
    body.push(0);
    body.extend_from_slice(text.as_bytes());
    let mut out = png[..iend].to_vec();
    out.extend_from_slice(&u32::try_from(body.len() - 4).unwrap().to_be_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&png_crc(&body).to_be_bytes());
    out.extend_from_slice(&png[iend..]);
    out
}

/// The text of the `tEXt` chunk `key` in `png`, its checksum verified.
fn text_chunk(png: &[u8], key: &str) -> Option<String> {
    let mut at = 8; // the signature
    while at + 12 <= png.len() {
        let length = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        let body = png.get(at + 4..at + 8 + length)?;
        let crc = u32::from_be_bytes(png.get(at + 8 + length..at + 12 + length)?.try_into().unwrap());
        if &body[..4] == b"tEXt" && png_crc(body) == crc {
            if let Some(text) = body[4..].strip_prefix(key.as_bytes()).and_then(|t| t.strip_prefix(&[0])) {
                return Some(String::from_utf8_lossy(text).into_owned());
            }
        }
        at += 12 + length;
    }
    None
}

/// The README's picture: keep-all and memo for the 7B model at 128K tokens on 8 A800 with t = 8,
/// side by side on one scale. Run it (from the repository root) with
///
/// ```text
/// cargo test -p memo-cli --features readme-picture --test pictures -- --ignored readme_picture
/// ```
///
/// It runs the same commands the README shows, then renders the SVG with resvg to
/// `docs/memory-timeline.png` (the feature brings the fonts for the labels), recording the
/// headings it shows in a text chunk for `the_readme_picture_shows_todays_plans`.
#[cfg(feature = "readme-picture")]
#[test]
#[ignore = "writes docs/memory-timeline.png; run it by hand when the picture changes"]
fn readme_picture() {
    let svg = readme_svg(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-picture"));
    let png = render(&svg, 1.0).encode_png().unwrap();
    let png = with_text_chunk(&png, HEADINGS_KEY, &headings(&svg));
    let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/memory-timeline.png");
    std::fs::write(target, &png).unwrap();
    println!("wrote {target}: {} bytes (SVG {} bytes)", png.len(), svg.len());
}

/// The committed picture shows the plans `memo` makes today: its recorded headings (each
/// arena, lower bound and host slab) are the ones the README's commands draw now. A change to
/// the planner that moves them fails here until the picture is made again (`readme_picture`).
#[test]
fn the_readme_picture_shows_todays_plans() {
    let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/memory-timeline.png")).unwrap();
    let recorded = text_chunk(&bytes, HEADINGS_KEY)
        .expect("docs/memory-timeline.png records its headings (made by readme_picture)");
    let today = headings(&readme_svg(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-picture-check")));
    assert!(today.lines().count() == 3, "a title and two panel headings:\n{today}");
    assert_eq!(
        recorded, today,
        "docs/memory-timeline.png is stale: run `cargo test -p memo-cli --features readme-picture --test pictures -- --ignored readme_picture`"
    );
}

/// Without the feature the picture would have no labels: say how to run it instead.
#[cfg(not(feature = "readme-picture"))]
#[test]
#[ignore = "writes docs/memory-timeline.png; run it by hand when the picture changes"]
fn readme_picture() {
    panic!("the labels need fonts: run `cargo test -p memo-cli --features readme-picture --test pictures -- --ignored readme_picture`");
}

#[test]
fn the_readme_picture_is_committed_and_small() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/memory-timeline.png");
    let bytes = std::fs::read(path).expect("docs/memory-timeline.png (made by the readme_picture test)");
    assert!(bytes.len() < 300 * 1024, "{} bytes", bytes.len());
    let pixmap = Pixmap::decode_png(&bytes).expect("a PNG");
    assert!(pixmap.width() > 1400 && pixmap.height() > 700);
    assert!(colours(&pixmap, ARENA_ROWS).len() > 8);
}
