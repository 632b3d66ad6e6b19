//! Block markers and bi-level plans: markers recorded as comments the trace parser skips, their
//! errors, level-1 layouts shared by identical blocks, replay of the bi-level addresses, and the
//! flat solve against the bi-level one on a 32-layer iteration.

use std::time::Instant;

use memo_place::check::check_placement;
use memo_place::{lower_bound, DEFAULT_BUDGET_NODES};

use super::super::blocks::{block_spans, BlockSpan};
use super::*;

/// One call of a test iteration: a request, or a block marker.
#[derive(Clone, Copy, Debug)]
enum Step {
    Op(Op),
    Begin(i64),
    End,
}

/// Builds an iteration's steps; frees name the malloc number in the iteration.
#[derive(Default)]
struct Builder {
    steps: Vec<Step>,
    mallocs: usize,
}

impl Builder {
    fn malloc(&mut self, size: usize) -> usize {
        self.steps.push(Step::Op(Op::Malloc(size)));
        self.mallocs += 1;
        self.mallocs - 1
    }
    fn free(&mut self, index: usize) {
        self.steps.push(Step::Op(Op::Free(index)));
    }
}

/// Key of the layers' forward blocks.
const FORWARD: i64 = 0;
/// Key of the layers' backward blocks.
const BACKWARD: i64 = 1;

/// A training iteration of `layers` identical layers, 30 requests each: a forward block (5
/// transients, 3 skeletal tensors kept for the backward, the layer output, the free of its input)
/// and a backward block (5 transients, the skeletal frees, the input gradient, the free of the
/// output gradient), between an embedding, a classifier and a gradient kept past the iteration.
/// Sizes come from `seed`, the same in every layer. With `marked`, each block is marked.
fn layered_iteration(layers: usize, seed: u64, marked: bool) -> Vec<Step> {
    let mut rng = SplitMix64::new(seed);
    let mut size = |low: u64, high: u64| 512 * rng.between(low, high) as usize;
    let transient: Vec<usize> = (0..10).map(|_| size(1, 64)).collect();
    let skeletal: Vec<usize> = (0..3).map(|_| size(8, 32)).collect();
    let hidden = size(8, 16);
    let mut b = Builder::default();
    let begin = |b: &mut Builder, key| {
        if marked {
            b.steps.push(Step::Begin(key));
        }
    };
    let end = |b: &mut Builder| {
        if marked {
            b.steps.push(Step::End);
        }
    };
    let mut input = b.malloc(hidden); // the embedding's output
    let mut saved = Vec::new();
    for _ in 0..layers {
        begin(&mut b, FORWARD);
        let t = &transient;
        let a = b.malloc(t[0]);
        let s0 = b.malloc(skeletal[0]);
        b.free(a);
        let (bb, c) = (b.malloc(t[1]), b.malloc(t[2]));
        let s1 = b.malloc(skeletal[1]);
        b.free(bb);
        let d = b.malloc(t[3]);
        b.free(c);
        let s2 = b.malloc(skeletal[2]);
        b.free(d);
        let e = b.malloc(t[4]);
        b.free(e);
        let output = b.malloc(hidden);
        b.free(input);
        input = output;
        saved.push([s0, s1, s2]);
        end(&mut b);
    }
    let logits = b.malloc(4 * hidden);
    b.free(logits);
    let mut gradient = b.malloc(hidden);
    b.free(input);
    for [s0, s1, s2] in saved.into_iter().rev() {
        begin(&mut b, BACKWARD);
        let t = &transient[5..];
        let (g, h) = (b.malloc(t[0]), b.malloc(t[1]));
        b.free(s2);
        b.free(g);
        let k = b.malloc(t[2]);
        b.free(s1);
        b.free(h);
        let m = b.malloc(t[3]);
        b.free(s0);
        b.free(k);
        let input_gradient = b.malloc(hidden);
        b.free(gradient);
        gradient = input_gradient;
        b.free(m);
        let n = b.malloc(t[4]);
        b.free(n);
        end(&mut b);
    }
    b.free(gradient);
    b.malloc(2048); // a parameter's gradient, kept past the iteration
    b.steps
}

/// Runs one iteration's steps; returns each malloc's address, in order. Buffers never freed are
/// freed after the iteration ends.
fn run_steps(allocator: &mut RecordReplayAllocator<FakeDevice>, steps: &[Step]) -> Vec<usize> {
    let mut addresses: Vec<(usize, usize)> = Vec::new();
    let mut freed = Vec::new();
    for &step in steps {
        match step {
            Step::Op(Op::Malloc(size)) => addresses.push((allocator.allocate(size, 0, 0).unwrap(), size)),
            Step::Op(Op::Free(index)) => {
                allocator.free(addresses[index].0, addresses[index].1, 0).unwrap();
                freed.push(index);
            }
            Step::Begin(key) => allocator.block_begin(key).unwrap(),
            Step::End => allocator.block_end().unwrap(),
        }
    }
    allocator.end_iteration().unwrap();
    for (index, &(address, size)) in addresses.iter().enumerate() {
        if !freed.contains(&index) {
            allocator.free(address, size, 0).unwrap();
        }
    }
    addresses.into_iter().map(|(address, _)| address).collect()
}

/// The trace text record mode writes for `steps`.
fn recorded_text(steps: &[Step]) -> String {
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    allocator.record(None).unwrap();
    run_steps(&mut allocator, steps);
    allocator.last_trace().unwrap().to_string()
}

/// The arena buffers of a trace (those it frees) and the plan's offsets for them.
fn arena_placement(text: &str, plan: &ReplayPlan) -> (Vec<BufferLifetime>, Vec<u64>) {
    let trace = parse_trace(text.as_bytes()).unwrap();
    let buffers: Vec<BufferLifetime> = trace.buffers.iter().copied().filter(|b| b.upper < trace.steps).collect();
    let offsets =
        plan.slots.iter().filter_map(|s| if let Slot::Arena { offset, .. } = s { Some(*offset) } else { None });
    (buffers, offsets.collect())
}

#[test]
fn markers_are_comments_the_trace_parser_skips() {
    let text = recorded_text(&layered_iteration(2, 7, true));
    assert!(text.contains("\n# memo-block begin 0\n") && text.contains("\n# memo-block end 1\n"), "{text}");
    assert!(text.contains("# 4 blocks marked"), "{text}");
    let unmarked = recorded_text(&layered_iteration(2, 7, false));
    assert_eq!(parse_trace(text.as_bytes()).unwrap(), parse_trace(unmarked.as_bytes()).unwrap());
    // Spans in request numbers: the embedding's malloc is request 0, each forward has 15
    // requests, the classifier 4.
    let spans = block_spans(text.as_bytes()).unwrap();
    let span = |key, begin| BlockSpan { key, begin, end: begin + 15 };
    assert_eq!(spans, [span(FORWARD, 1), span(FORWARD, 16), span(BACKWARD, 35), span(BACKWARD, 50)]);
    assert_eq!(block_spans(unmarked.as_bytes()).unwrap(), []);
}

#[test]
fn malformed_markers_are_invalid_traces_naming_the_line() {
    let cases: [(&str, &str); 7] = [
        ("# memo-block begin 1\n# memo-block begin 2\n", "line 2: block 2 begins inside block 1 (opened on line 1)"),
        ("malloc 0 10\n# memo-block end 3\n", "line 2: end of block 3, but no block is open"),
        ("# memo-block begin 1\nmalloc 0 1\n# memo-block end 2\n", "line 3: end of block 2, but block 1 is open"),
        ("\n# memo-block begin 4\nmalloc 0 1\n", "line 2: block 4 is never ended"),
        ("# memo-block begin x1\n", "line 1: block marker key `x1` is not a 64-bit signed integer"),
        ("#memo-block open 1\n", "line 1: block marker `open`: expected `begin` or `end`"),
        ("# memo-block begin\n", "line 1: a block marker reads `# memo-block begin <key>`"),
    ];
    for (text, expected) in cases {
        let error = block_spans(text.as_bytes()).unwrap_err();
        assert_eq!(error.status, MemoStatus::InvalidTrace);
        assert!(error.message.starts_with(expected), "{text:?}: {}", error.message);
    }
    // Other comments, blank lines and comments after a request are not markers; keys may be
    // negative.
    let text = "# memo-blocks are here\n\nmalloc 0 1 # memo-block begin 9\n# memo-block begin -5\nfree 0 1\n# memo-block end -5\n";
    assert_eq!(block_spans(text.as_bytes()).unwrap(), [BlockSpan { key: -5, begin: 1, end: 2 }]);
    let plan = ReplayPlan::from_text(b"# memo-block begin 1\nmalloc 0 512\nfree 0 512\n", &options()).unwrap_err();
    assert!(plan.message.contains("block 1 is never ended"), "{}", plan.message);
}

#[test]
fn marker_calls_are_checked_while_recording_and_ignored_otherwise() {
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    // Passthrough: nothing to mark, nothing refused.
    allocator.block_end().unwrap();
    allocator.block_begin(3).unwrap();
    allocator.block_begin(4).unwrap();
    allocator.record(None).unwrap();
    assert_eq!(allocator.block_end().unwrap_err().status, MemoStatus::InvalidState);
    allocator.block_begin(1).unwrap();
    let nested = allocator.block_begin(2).unwrap_err();
    assert_eq!(nested.status, MemoStatus::InvalidState);
    assert!(nested.message.contains("block 1 is still open"), "{}", nested.message);
    let address = allocator.allocate(512, 0, 0).unwrap();
    allocator.free(address, 512, 0).unwrap();
    // The iteration ends with block 1 open: it is closed there, and the next one starts closed.
    allocator.end_iteration().unwrap();
    let text = allocator.last_trace().unwrap().to_string();
    assert!(text.ends_with("# memo-block begin 1\nmalloc 0 512\nfree 0 512\n# memo-block end 1\n"), "{text}");
    assert_eq!(allocator.block_end().unwrap_err().status, MemoStatus::InvalidState);
    let plan = allocator.plan_recorded(&options()).unwrap();
    assert_eq!((plan.block_instances, plan.level1_problems, plan.arena_bytes), (1, 1, 512));
}

#[test]
fn identical_layers_share_one_layout_and_replay_their_addresses() {
    let steps = layered_iteration(8, 11, true);
    let mut allocator = RecordReplayAllocator::new(FakeDevice::new());
    allocator.record(None).unwrap();
    run_steps(&mut allocator, &steps);
    let text = allocator.last_trace().unwrap().to_string();
    let plan = allocator.plan_recorded(&options()).unwrap().clone();
    assert_eq!((plan.block_instances, plan.level1_problems), (16, 2));

    // Independently: no two buffers alive together share a byte, and the arena holds them all.
    let (buffers, offsets) = arena_placement(&text, &plan);
    check_placement(&buffers, &offsets, plan.alignment, plan.arena_bytes, None).unwrap();
    assert!(plan.arena_bytes >= lower_bound(&buffers, plan.alignment));
    assert_eq!(plan.lower_bound, lower_bound(&buffers, plan.alignment));

    // Every forward block has the same layout of its own 5 transients (offsets relative to the
    // first), and so does every backward block: level 1 was solved once per kind.
    let spans = block_spans(text.as_bytes()).unwrap();
    let mut layouts: BTreeMap<i64, Vec<Vec<i64>>> = BTreeMap::new();
    for span in &spans {
        let own: Vec<u64> = buffers
            .iter()
            .zip(&offsets)
            .filter(|(b, _)| span.begin <= b.lower && b.upper < span.end)
            .map(|(_, &offset)| offset)
            .collect();
        assert_eq!(own.len(), 5);
        layouts.entry(span.key).or_default().push(own.iter().map(|&o| o as i64 - own[0] as i64).collect());
    }
    for (key, layout) in &layouts {
        assert_eq!(layout.len(), 8);
        assert!(layout.iter().all(|l| l == &layout[0]), "key {key}: {layout:?}");
    }

    // Replay hands out exactly those addresses, iteration after iteration, markers and all.
    allocator.replay(0).unwrap();
    allocator.reset_counters();
    let base = allocator.arena().unwrap().base;
    for _ in 0..2 {
        let addresses = run_steps(&mut allocator, &steps);
        for (k, (&address, slot)) in addresses.iter().zip(&plan.slots).enumerate() {
            match *slot {
                Slot::Arena { offset, .. } => assert_eq!(address, base + offset as usize, "request {k}"),
                Slot::Device { .. } => assert!(allocator.arena().unwrap().offset_of(address).is_none()),
            }
        }
    }
    let c = allocator.counters();
    assert_eq!((c.fallbacks, c.unplanned, c.replayed), (0, 2, 2 * (plan.slots.len() as u64 - 1)));
}

/// Pins the case where bi-level placement costs memory: block 0's first buffer (100 units) and
/// last (10) never meet, so level 1 gives the block 100 units over its whole span, and the buffer
/// that crosses its end (100) cannot use the 90 the block leaves free at its end. Flat: 110
/// units; bi-level: 200. Under a capacity of 150 the plan is retried flat and fits.
#[test]
fn a_capacity_bilevel_misses_is_met_by_the_flat_solve() {
    let unit = 512;
    let text = format!(
        "# memo-block begin 0\nmalloc 0 {a}\nfree 0 {a}\nmalloc 1 {b}\nmalloc 2 {a}\nfree 1 {b}\n# memo-block end 0\nfree 2 {a}\n",
        a = 100 * unit,
        b = 10 * unit
    );
    let bilevel = ReplayPlan::from_text(text.as_bytes(), &options()).unwrap();
    assert_eq!((bilevel.arena_bytes, bilevel.lower_bound, bilevel.optimal), (200 * unit, 110 * unit, false));
    assert_eq!(bilevel.block_instances, 1);
    let capped = replay_solve_options(Some(150 * unit), MEMO_DEFAULT_REPLAY_ALIGNMENT, 100_000);
    let flat = ReplayPlan::from_text(text.as_bytes(), &capped).unwrap();
    assert_eq!((flat.arena_bytes, flat.optimal, flat.block_instances), (110 * unit, true, 0));
    let tight = replay_solve_options(Some(100 * unit), MEMO_DEFAULT_REPLAY_ALIGNMENT, 100_000);
    let error = ReplayPlan::from_text(text.as_bytes(), &tight).unwrap_err();
    assert_eq!(error.status, MemoStatus::Infeasible, "the flat solve's proof is the one reported");
}

/// MEMO's reason for two levels: the flat solve of a whole iteration grows with its length, the
/// bi-level one with the distinct blocks and the level-2 requests. Prints both peaks and times
/// for 32 layers of 30 requests with the options `memo_allocator_plan(NULL)` uses (the figures
/// in spec/c-api.md come from a release build), and holds the bi-level peak within 2% of the
/// lower bound (it is 1.04% above on this instance: each block keeps its level-1 peak over its
/// whole span).
#[test]
fn bilevel_against_flat_on_32_layers_of_30_requests() {
    let text = recorded_text(&layered_iteration(32, 3, true));
    let trace = parse_trace(text.as_bytes()).unwrap();
    let options = replay_solve_options(None, MEMO_DEFAULT_REPLAY_ALIGNMENT, DEFAULT_BUDGET_NODES);
    let started = Instant::now();
    let bilevel = ReplayPlan::from_text(text.as_bytes(), &options).unwrap();
    let bilevel_time = started.elapsed();
    let started = Instant::now();
    let flat = ReplayPlan::from_trace(&trace, &[], &options).unwrap();
    let flat_time = started.elapsed();
    let (buffers, offsets) = arena_placement(&text, &bilevel);
    check_placement(&buffers, &offsets, bilevel.alignment, bilevel.arena_bytes, None).unwrap();
    assert_eq!((bilevel.block_instances, bilevel.level1_problems), (64, 2));
    assert_eq!(bilevel.lower_bound, flat.lower_bound);
    assert!(flat.arena_bytes >= flat.lower_bound);
    assert!(
        bilevel.arena_bytes * 100 <= bilevel.lower_bound * 102,
        "{} vs {}",
        bilevel.arena_bytes,
        bilevel.lower_bound
    );
    println!(
        "32 layers x 30 requests ({} requests, {} arena buffers), alignment {}, budget {} nodes:\n  \
         flat:     peak {} bytes ({:.4} x lower bound {}), {}optimal, {:.3} s\n  \
         bi-level: peak {} bytes ({:.4} x lower bound), {}optimal, {:.3} s ({} block instances, {} level-1 problems)",
        trace.steps,
        buffers.len(),
        bilevel.alignment,
        options.budget_nodes,
        flat.arena_bytes,
        flat.arena_bytes as f64 / flat.lower_bound as f64,
        flat.lower_bound,
        if flat.optimal { "proven " } else { "not proven " },
        flat_time.as_secs_f64(),
        bilevel.arena_bytes,
        bilevel.arena_bytes as f64 / bilevel.lower_bound as f64,
        if bilevel.optimal { "proven " } else { "not proven " },
        bilevel_time.as_secs_f64(),
        bilevel.block_instances,
        bilevel.level1_problems,
    );
}
