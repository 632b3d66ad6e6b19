use super::*;

fn kind(input: &str) -> (usize, TraceErrorKind) {
    let e = parse_trace(input.as_bytes()).unwrap_err();
    (e.line, e.kind)
}

#[test]
fn memo_text_gives_half_open_lifetimes_by_request_index() {
    let trace = parse_trace(b"# c\nmalloc 1 10\nmalloc 2 5KiB # trailing\n\nfree 1 10\nfree 2 5KiB\n").unwrap();
    assert_eq!(trace.format, TraceFormat::MemoText);
    assert_eq!(
        trace.buffers,
        [
            BufferLifetime { id: 1, lower: 0, upper: 2, size: 10 },
            BufferLifetime { id: 2, lower: 1, upper: 3, size: 5120 }
        ]
    );
    assert_eq!(trace.steps, 4);
    assert_eq!(trace.never_freed, 0);
}

#[test]
fn memo_text_buffer_never_freed_lives_to_the_end() {
    let trace = parse_trace(b"malloc 1 10\nmalloc 2 20\nfree 2 20\n").unwrap();
    assert_eq!(trace.buffers[0].upper, 3);
    assert_eq!(trace.never_freed, 1);
}

#[test]
fn memo_text_ids_may_be_reused_after_free() {
    let trace = parse_trace(b"malloc 1 10\nfree 1 10\nmalloc 1 20\nfree 1 20\n").unwrap();
    assert_eq!(trace.buffers.len(), 2);
    assert_eq!(trace.buffers[1], BufferLifetime { id: 1, lower: 2, upper: 3, size: 20 });
}

#[test]
fn memo_text_errors_name_the_line() {
    assert_eq!(kind("malloc 1 10\nmalloc 1 10\n"), (2, TraceErrorKind::DoubleMalloc { id: 1, previous_line: 1 }));
    assert_eq!(kind("malloc 1 10\nfree 2 10\n"), (2, TraceErrorKind::FreeOfUnknown { id: 2 }));
    assert_eq!(kind("malloc 1 10\nfree 1 10\nfree 1 10"), (3, TraceErrorKind::FreeOfUnknown { id: 1 }));
    assert_eq!(
        kind("malloc 1 10\n\nfree 1 11\n"),
        (3, TraceErrorKind::SizeMismatch { id: 1, malloc_size: 10, free_size: 11 })
    );
    assert_eq!(kind("malloc 1\n"), (1, TraceErrorKind::FieldCount { expected: 3, found: 2 }));
    assert_eq!(kind("malloc 1 2 3\n"), (1, TraceErrorKind::FieldCount { expected: 3, found: 4 }));
    assert_eq!(kind("malloc x 2\n"), (1, TraceErrorKind::BadNumber { field: "id" }));
    assert_eq!(kind("malloc 1 -2\n"), (1, TraceErrorKind::BadNumber { field: "size" }));
    assert_eq!(kind("malloc 1 2PB\n"), (1, TraceErrorKind::BadNumber { field: "size" }));
    assert_eq!(kind("malloc 1 99999999999TB\n"), (1, TraceErrorKind::BadNumber { field: "size" }));
    assert_eq!(kind("malloc 1 2\nalloc 2 3\n"), (2, TraceErrorKind::UnknownRequest));
    assert_eq!(kind("hello\n"), (1, TraceErrorKind::UnknownFormat));
    assert_eq!(kind("# nothing\n\n"), (0, TraceErrorKind::Empty));
    let e = parse_trace(b"malloc 1 2\n\xff\n").unwrap_err();
    assert_eq!((e.line, e.kind), (2, TraceErrorKind::NotUtf8));
}

#[test]
fn errors_display_line_and_fix() {
    let e = parse_trace(b"malloc 1 10\nfree 1 11\n").unwrap_err();
    let text = alloc::format!("{e}");
    assert!(text.starts_with("line 2: free of id 1 with size 11"), "{text}");
}

#[test]
fn csv_reads_columns_in_any_order_and_ignores_offset() {
    let trace = parse_trace(b"size,id,lower,upper,offset\n10,0,0,2,0\n5,1,1,3,10\n").unwrap();
    assert_eq!(trace.format, TraceFormat::DsaCsv);
    assert_eq!(
        trace.buffers,
        [BufferLifetime { id: 0, lower: 0, upper: 2, size: 10 }, BufferLifetime { id: 1, lower: 1, upper: 3, size: 5 }]
    );
    assert_eq!(trace.steps, 3);
}

#[test]
fn csv_errors_name_the_line() {
    assert_eq!(kind("id,lower,upper\n"), (1, TraceErrorKind::BadHeader));
    assert_eq!(kind("id,lower,upper,size,size\n"), (1, TraceErrorKind::BadHeader));
    assert_eq!(kind("id,lower,upper,size,colour\n"), (1, TraceErrorKind::BadHeader));
    assert_eq!(kind("id,lower,upper,size\n0,3,3,1\n"), (2, TraceErrorKind::EmptyLifetime { id: 0 }));
    assert_eq!(kind("id,lower,upper,size\n0,1,3\n"), (2, TraceErrorKind::FieldCount { expected: 4, found: 3 }));
    assert_eq!(kind("id,lower,upper,size\n0,1,99999999999,1\n"), (2, TraceErrorKind::TooManySteps));
    assert_eq!(kind("id,lower,upper,size\n"), (0, TraceErrorKind::Empty));
    assert_eq!(
        kind("id,lower,upper,size\n7,0,5,1\n8,0,5,1\n7,4,6,1\n"),
        (4, TraceErrorKind::DuplicateLiveId { id: 7, previous_line: 2 })
    );
    // The same id over disjoint lifetimes is fine.
    assert!(parse_trace(b"id,lower,upper,size\n7,0,5,1\n7,5,6,1\n").is_ok());
}

#[test]
fn the_memo_example_parses() {
    let trace = parse_trace(include_bytes!("../../../examples/traces/memo-layer.trace")).unwrap();
    assert_eq!(trace.buffers.len(), 12);
    assert_eq!(trace.steps, 24);
    assert_eq!(trace.never_freed, 0);
    let skeletal_16 = trace.buffers.iter().find(|b| b.id == 16).unwrap();
    assert_eq!((skeletal_16.lower, skeletal_16.upper, skeletal_16.size), (5, 23, 512_000_000));
}
