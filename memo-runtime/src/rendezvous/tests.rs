//! The exchange on loopback, with threads or raw sockets as the other ranks. Ports come from
//! binding port 0. Timeouts are behaviour here (200 ms where a test waits for one to pass; 20 s
//! where none should pass), never asserted durations.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::*;

/// Long enough never to pass in a test that succeeds or fails for another reason.
const NEVER: Duration = Duration::from_secs(20);
/// Short: for the tests whose point is that a timeout passes.
const SHORT: Duration = Duration::from_millis(200);

fn id() -> Vec<u8> {
    (0..128u8).map(|b| b.wrapping_mul(37).wrapping_add(11)).collect()
}

/// A port nothing listens on now (bound to port 0, then closed).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("address").port()
}

fn bound_root() -> (Root, u16) {
    let root = Root::bind("127.0.0.1:0").expect("bind port 0");
    let port = root.local_addr().expect("address").port();
    (root, port)
}

fn hello(magic: [u8; 8], version: u16, world: u32, rank: u32) -> Vec<u8> {
    let mut bytes = magic.to_vec();
    bytes.extend_from_slice(&version.to_be_bytes());
    bytes.extend_from_slice(&world.to_be_bytes());
    bytes.extend_from_slice(&rank.to_be_bytes());
    bytes
}

/// A rank as raw bytes: connected and its hello sent before rank 0 serves (the connection waits
/// in the listener's backlog), so the order rank 0 sees is the order of these calls.
fn raw_rank(port: u16, world: u32, rank: u32) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.write_all(&hello(MAGIC, PROTOCOL_VERSION, world, rank)).expect("hello");
    stream
}

/// Reads a reply: (status, payload).
fn reply(stream: &mut TcpStream) -> (u8, Vec<u8>) {
    stream.set_read_timeout(Some(NEVER)).expect("timeout");
    let mut header = [0u8; REPLY_HEADER_BYTES];
    stream.read_exact(&mut header).expect("reply header");
    assert_eq!(header[..8], MAGIC);
    assert_eq!(u16::from_be_bytes([header[8], header[9]]), PROTOCOL_VERSION);
    let length = u32::from_be_bytes([header[11], header[12], header[13], header[14]]) as usize;
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).expect("reply payload");
    (header[10], payload)
}

fn refused_reason(stream: &mut TcpStream) -> String {
    let (status, payload) = reply(stream);
    assert_eq!(status, STATUS_REFUSED);
    String::from_utf8(payload).expect("utf-8 reason")
}

#[test]
fn four_ranks_get_rank_0s_identifier_made_once() {
    let port = free_port();
    let made = AtomicUsize::new(0);
    let results: Vec<Result<Vec<u8>, RendezvousError>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|rank| {
                let made = &made;
                scope.spawn(move || {
                    exchange("127.0.0.1", port, 4, rank, NEVER, || {
                        made.fetch_add(1, Ordering::SeqCst);
                        Ok(id())
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    });
    for (rank, result) in results.into_iter().enumerate() {
        assert_eq!(result, Ok(id()), "rank {rank}");
    }
    assert_eq!(made.load(Ordering::SeqCst), 1, "only rank 0 makes the identifier");
}

#[test]
fn ranks_started_before_rank_0_retry_until_it_listens() {
    let port = free_port();
    let results: Vec<_> = thread::scope(|scope| {
        let others: Vec<_> = (1..3)
            .map(|rank| scope.spawn(move || exchange("127.0.0.1", port, 3, rank, NEVER, || Err("not rank 0".into()))))
            .collect();
        // Not a timing assertion: whenever rank 0 starts, the others must still get the id.
        thread::sleep(Duration::from_millis(50));
        let root = exchange("127.0.0.1", port, 3, 0, NEVER, || Ok(vec![7; 128]));
        let mut all = vec![root];
        all.extend(others.into_iter().map(|h| h.join().expect("no panic")));
        all
    });
    assert!(results.iter().all(|r| r == &Ok(vec![7; 128])), "{results:?}");
}

#[test]
fn one_rank_makes_the_identifier_without_listening() {
    // Port 1 on an address nothing may bind: a listener would fail.
    assert_eq!(exchange("192.0.2.1", 1, 1, 0, SHORT, || Ok(vec![1, 2, 3])), Ok(vec![1, 2, 3]));
    assert_eq!(
        exchange("127.0.0.1", 1, 1, 0, SHORT, || Err("no library".into())),
        Err(RendezvousError::MakeId("no library".into()))
    );
}

#[test]
fn a_rank_with_another_world_size_ends_the_rendezvous_on_every_rank() {
    let (root, port) = bound_root();
    let mut first = raw_rank(port, 4, 1);
    let result = thread::scope(|scope| {
        let wrong = scope.spawn(move || exchange("127.0.0.1", port, 3, 2, NEVER, || Err("not rank 0".into())));
        let served = root.serve(4, NEVER, || Ok(id()));
        (served, wrong.join().expect("no panic"))
    });
    assert_eq!(result.0, Err(RendezvousError::WorldSizeMismatch { rank: 2, theirs: 3, ours: 4 }));
    let Err(RendezvousError::Refused { reason }) = &result.1 else { panic!("{:?}", result.1) };
    assert!(reason.contains("rank 2 says WORLD_SIZE=3, rank 0 says WORLD_SIZE=4"), "{reason}");
    // The rank that had already joined is told too, rather than left waiting for its timeout.
    assert_eq!(refused_reason(&mut first), result.0.unwrap_err().to_string());
}

#[test]
fn a_timeout_too_long_to_add_means_wait_without_end_not_a_panic() {
    let (root, port) = bound_root();
    let mut a = raw_rank(port, 3, 1);
    let mut b = raw_rank(port, 3, 1);
    assert_eq!(root.serve(3, Duration::MAX, || Ok(id())), Err(RendezvousError::DuplicateRank { rank: 1 }));
    assert!(refused_reason(&mut a).contains("claim rank 1") && refused_reason(&mut b).contains("claim rank 1"));
    let (root, port) = bound_root();
    let result = thread::scope(|scope| {
        let one = scope.spawn(move || exchange("127.0.0.1", port, 2, 1, Duration::MAX, || Err("not rank 0".into())));
        let served = root.serve(2, Duration::MAX, || Ok(id()));
        (served, one.join().expect("no panic"))
    });
    assert_eq!(result, (Ok(id()), Ok(id())));
}

#[test]
fn two_processes_claiming_one_rank_end_the_rendezvous() {
    let (root, port) = bound_root();
    let mut a = raw_rank(port, 3, 1);
    let mut b = raw_rank(port, 3, 1);
    assert_eq!(root.serve(3, NEVER, || Ok(id())), Err(RendezvousError::DuplicateRank { rank: 1 }));
    for stream in [&mut a, &mut b] {
        assert!(refused_reason(stream).contains("two processes claim rank 1"));
    }
}

#[test]
fn a_rank_claiming_rank_0_or_one_past_the_world_is_refused() {
    let (root, port) = bound_root();
    let mut zero = raw_rank(port, 3, 0);
    assert_eq!(root.serve(3, NEVER, || Ok(id())), Err(RendezvousError::DuplicateRank { rank: 0 }));
    assert!(refused_reason(&mut zero).contains("claim rank 0"));

    let (root, port) = bound_root();
    let mut past = raw_rank(port, 3, 3);
    assert_eq!(root.serve(3, NEVER, || Ok(id())), Err(RendezvousError::RankOutOfRange { rank: 3, world_size: 3 }));
    assert!(refused_reason(&mut past).contains("rank 3 is outside the world of 3 ranks"));
}

#[test]
fn a_rank_that_does_not_show_up_is_named_and_the_others_are_told() {
    let (root, port) = bound_root();
    let mut one = raw_rank(port, 4, 1);
    let mut two = raw_rank(port, 4, 2);
    let made = AtomicUsize::new(0);
    let result = root.serve(4, SHORT, || {
        made.fetch_add(1, Ordering::SeqCst);
        Ok(id())
    });
    let Err(RendezvousError::RanksMissing { missing, world_size: 4, .. }) = &result else { panic!("{result:?}") };
    assert_eq!(missing, &vec![3]);
    assert_eq!(made.load(Ordering::SeqCst), 0, "no identifier is made for a failed rendezvous");
    let text = result.unwrap_err().to_string();
    let expected = format!("rank 3 of 4 did not connect to rank 0 at 127.0.0.1:{port} within 200ms");
    assert!(text.starts_with(&expected), "{text}");
    assert_eq!(refused_reason(&mut one), text);
    assert_eq!(refused_reason(&mut two), text);
}

#[test]
fn a_waiting_rank_hears_why_rank_0_gave_up() {
    let (root, port) = bound_root();
    let result = thread::scope(|scope| {
        let waiting = scope.spawn(move || exchange("127.0.0.1", port, 3, 1, NEVER, || Err("not rank 0".into())));
        // Rank 2 never comes; rank 0 gives up after SHORT and tells rank 1 (if it joined by
        // then; otherwise rank 1 finds the listener closed and its own error says so).
        let served = root.serve(3, SHORT, || Ok(id()));
        (served, waiting.join().expect("no panic"))
    });
    let Err(RendezvousError::RanksMissing { missing, .. }) = &result.0 else { panic!("{:?}", result.0) };
    assert!(missing.contains(&2), "{missing:?}");
    assert!(result.1.is_err(), "{:?}", result.1);
}

#[test]
fn a_rank_0_that_is_not_there_is_unreachable_after_the_timeout() {
    let port = free_port();
    let result = exchange("127.0.0.1", port, 2, 1, SHORT, || Err("not rank 0".into()));
    let Err(RendezvousError::Unreachable { address, waited, last_error }) = &result else { panic!("{result:?}") };
    assert_eq!(address, &format!("127.0.0.1:{port}"));
    assert_eq!(*waited, SHORT);
    assert!(!last_error.is_empty());
    assert!(result.unwrap_err().to_string().contains("could not be reached within 200ms"));
}

#[test]
fn a_rank_0_that_accepts_but_never_answers_is_no_reply_after_the_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("address").port();
    let result = exchange("127.0.0.1", port, 2, 1, SHORT, || Err("not rank 0".into()));
    assert_eq!(result, Err(RendezvousError::NoReply { address: format!("127.0.0.1:{port}"), waited: SHORT }));
    drop(silent);
}

#[test]
fn a_peer_that_is_not_a_rendezvous_is_named() {
    let other = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = other.local_addr().expect("address").port();
    let result = thread::scope(|scope| {
        scope.spawn(move || {
            if let Ok((mut stream, _)) = other.accept() {
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            }
        });
        exchange("127.0.0.1", port, 2, 1, NEVER, || Err("not rank 0".into()))
    });
    assert_eq!(result, Err(RendezvousError::NotARendezvous { address: format!("127.0.0.1:{port}") }));
}

#[test]
fn connections_without_the_magic_are_ignored() {
    let (root, port) = bound_root();
    let mut stray = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stray.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    // Connects and closes without a word (rank 0 reads end of file, not a hello).
    drop(TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    let mut real = raw_rank(port, 2, 1);
    assert_eq!(root.serve(2, NEVER, || Ok(id())), Ok(id()));
    assert_eq!(reply(&mut real), (STATUS_OK, id()));
    let mut rest = Vec::new();
    let _ = stray.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the stray connection got {rest:?}");
}

#[test]
fn another_protocol_version_is_refused_by_name() {
    let (root, port) = bound_root();
    let mut newer = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    newer.write_all(&hello(MAGIC, PROTOCOL_VERSION + 1, 2, 1)).expect("hello");
    assert_eq!(
        root.serve(2, NEVER, || Ok(id())),
        Err(RendezvousError::ProtocolVersion { ours: PROTOCOL_VERSION, theirs: PROTOCOL_VERSION + 1 })
    );
    assert!(refused_reason(&mut newer).contains("protocol version 2, this build 1"));
}

#[test]
fn a_failure_to_make_the_identifier_reaches_every_rank() {
    let (root, port) = bound_root();
    let mut one = raw_rank(port, 2, 1);
    let result = root.serve(2, NEVER, || Err("libnccl.so.2 not found".into()));
    assert_eq!(result, Err(RendezvousError::MakeId("libnccl.so.2 not found".into())));
    assert_eq!(refused_reason(&mut one), "rank 0 could not make the identifier: libnccl.so.2 not found");
}

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
    move |name| map.get(name).cloned()
}

const TORCHRUN: [(&str, &str); 5] =
    [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"), ("MASTER_ADDR", "node-0"), ("MASTER_PORT", "29500")];

#[test]
fn the_torchrun_variables_are_read() {
    assert_eq!(
        TorchrunEnv::from_vars(vars(&TORCHRUN)),
        Ok(TorchrunEnv {
            rank: 3,
            world_size: 8,
            local_rank: 3,
            master_addr: "node-0".into(),
            // MASTER_PORT + 1: torchrun's store holds 29500 itself.
            port: 29501,
            timeout: DEFAULT_TIMEOUT,
        })
    );
    let mut more = TORCHRUN.to_vec();
    more.extend([(PORT_VARIABLE, "29600"), (TIMEOUT_VARIABLE, "0.5")]);
    let env = TorchrunEnv::from_vars(vars(&more)).expect("valid");
    assert_eq!((env.port, env.timeout), (29600, Duration::from_millis(500)));
}

#[test]
fn each_missing_variable_is_named_with_its_form() {
    for missing in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
        let pairs: Vec<_> = TORCHRUN.iter().copied().filter(|(k, _)| *k != missing).collect();
        let error = TorchrunEnv::from_vars(vars(&pairs)).expect_err(missing);
        let RendezvousError::MissingVariable { name, .. } = &error else { panic!("{error:?}") };
        assert_eq!(*name, missing);
        assert!(error.to_string().starts_with(&format!("{missing} is not set: it should hold ")), "{error}");
    }
}

#[test]
fn each_malformed_variable_is_named_with_its_value() {
    let cases = [
        ("RANK", "x", "RANK"),
        ("RANK", "-1", "RANK"),
        ("WORLD_SIZE", "0", "WORLD_SIZE"),
        ("WORLD_SIZE", "eight", "WORLD_SIZE"),
        ("LOCAL_RANK", "", "LOCAL_RANK"),
        ("MASTER_ADDR", " ", "MASTER_ADDR"),
        ("MASTER_PORT", "70000", "MASTER_PORT"),
        ("MASTER_PORT", "0", "MASTER_PORT"),
        ("MASTER_PORT", "65535", "MASTER_PORT"),
        (PORT_VARIABLE, "http", PORT_VARIABLE),
        (TIMEOUT_VARIABLE, "-1", TIMEOUT_VARIABLE),
        (TIMEOUT_VARIABLE, "NaN", TIMEOUT_VARIABLE),
    ];
    for (variable, value, named) in cases {
        let mut pairs: Vec<_> = TORCHRUN.iter().copied().filter(|(k, _)| *k != variable).collect();
        pairs.push((variable, value));
        let error = TorchrunEnv::from_vars(vars(&pairs)).expect_err(variable);
        let RendezvousError::MalformedVariable { name, value: got, .. } = &error else { panic!("{error:?}") };
        assert_eq!((*name, got.as_str()), (named, value));
        assert!(error.to_string().starts_with(&format!("{named}={value:?} is not ")), "{error}");
    }
    let mut pairs = TORCHRUN.to_vec();
    pairs[0] = ("RANK", "8");
    assert_eq!(TorchrunEnv::from_vars(vars(&pairs)), Err(RendezvousError::RankOutOfRange { rank: 8, world_size: 8 }));
}

#[test]
fn a_port_in_use_is_a_bind_error_that_names_the_override() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port();
    let result = exchange("127.0.0.1", port, 2, 0, SHORT, || Ok(id()));
    let Err(error @ RendezvousError::Bind { .. }) = result else { panic!("{result:?}") };
    assert!(error.to_string().contains(PORT_VARIABLE), "{error}");
}
