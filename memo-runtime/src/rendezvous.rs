//! Ranks across processes and nodes, as `torchrun` starts them: this module reads the rank and
//! the world from the environment ([`TorchrunEnv`]) and hands out one opaque identifier (NCCL's or
//! RCCL's 128-byte unique id) from rank 0 to every other rank over a TCP listener of rank 0's own
//! ([`exchange`]). It carries nothing else: the collectives themselves are the GPU library's
//! (`spec/backends.md`, "Collectives on GPUs"), never a transport of this crate.
//!
//! The protocol (version [`PROTOCOL_VERSION`]; integers big-endian):
//!
//! ```text
//! rank r -> rank 0   hello: MAGIC (8 bytes "MEMO-RDV") | version u16 | world size u32 | rank u32
//! rank 0 -> rank r   reply: MAGIC | version u16 | status u8 | length u32 | length bytes
//!                    status 0: the bytes are the identifier; otherwise a UTF-8 reason
//! ```
//!
//! Rank 0 waits until every rank 1..world has said hello, then makes the identifier (the closure
//! given to [`exchange`], so this crate needs no GPU library, and no identifier is made for a
//! rendezvous that fails) and sends it to each. Every failure is one error on every rank that is
//! still waiting, never a hang or a panic: a hello with another world size or protocol version, a
//! rank claimed twice, a rank out of range, a rank that does not connect within the timeout (rank 0
//! names the missing ranks and tells the connected ones why it gave up), a rank 0 that cannot be
//! reached within the timeout. A connection that does not start with [`MAGIC`] (a port scanner, a
//! health check), or says nothing for 5 s, is closed and ignored.

use std::ffi::OsString;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first bytes of every message.
pub const MAGIC: [u8; 8] = *b"MEMO-RDV";
/// The protocol version; both sides must agree.
pub const PROTOCOL_VERSION: u16 = 1;
/// The largest identifier or reason a reply carries (NCCL's unique id is 128 bytes).
pub const MAX_PAYLOAD: usize = 4096;
/// How long every rank waits for the whole exchange unless `MEMO_RENDEZVOUS_TIMEOUT` says.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Overrides the port of rank 0's listener (default `MASTER_PORT + 1`: torchrun's own store
/// already listens on `MASTER_PORT`); give every rank the same free port here when that one is
/// taken too.
pub const PORT_VARIABLE: &str = "MEMO_RENDEZVOUS_PORT";
/// The whole exchange's timeout, in seconds (a positive number, fractions allowed).
pub const TIMEOUT_VARIABLE: &str = "MEMO_RENDEZVOUS_TIMEOUT";

/// Reply status: the identifier follows.
const STATUS_OK: u8 = 0;
/// Reply status: rank 0 refused this rank or gave up; a reason follows.
const STATUS_REFUSED: u8 = 1;

/// Length of a hello: magic, version, world size, rank.
const HELLO_BYTES: usize = 8 + 2 + 4 + 4;
/// Length of a reply's header: magic, version, status, length.
const REPLY_HEADER_BYTES: usize = 8 + 2 + 1 + 4;
/// How long rank 0 waits for the hello of a connection it accepted.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// The longest sleep between two polls (accept, connect).
const POLL: Duration = Duration::from_millis(10);

/// One process's place among the ranks, as `torchrun` (and `torch.distributed.launch`, and most
/// cluster launchers) set it in the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchrunEnv {
    /// `RANK`: this process's rank, `0..world_size`.
    pub rank: usize,
    /// `WORLD_SIZE`: how many ranks, at least 1.
    pub world_size: usize,
    /// `LOCAL_RANK`: this process's index on its node (the device it uses).
    pub local_rank: usize,
    /// `MASTER_ADDR`: the host name or address of rank 0.
    pub master_addr: String,
    /// The port of rank 0's listener: `MEMO_RENDEZVOUS_PORT` if set, else `MASTER_PORT + 1`
    /// (clear of torchrun's store, which holds `MASTER_PORT` itself).
    pub port: u16,
    /// `MEMO_RENDEZVOUS_TIMEOUT` (seconds) if set, else [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
}

impl TorchrunEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<TorchrunEnv, RendezvousError> {
        TorchrunEnv::from_vars(|name| std::env::var_os(name))
    }

    /// Reads the variables through `get` (the process environment in [`TorchrunEnv::from_env`];
    /// a map in tests). A missing or malformed variable is an error naming it and the form
    /// expected.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<TorchrunEnv, RendezvousError> {
        let text = |name: &'static str, expected: &'static str| -> Result<String, RendezvousError> {
            let value = get(name).ok_or(RendezvousError::MissingVariable { name, expected })?;
            value.into_string().map_err(|value| RendezvousError::MalformedVariable {
                name,
                value: value.to_string_lossy().into_owned(),
                expected,
            })
        };
        let number = |name: &'static str, expected: &'static str| -> Result<usize, RendezvousError> {
            let value = text(name, expected)?;
            value.trim().parse::<usize>().map_err(|_| RendezvousError::MalformedVariable { name, value, expected })
        };
        let port_of = |name: &'static str, value: String| -> Result<u16, RendezvousError> {
            match value.trim().parse::<u16>() {
                Ok(port) if port > 0 => Ok(port),
                _ => Err(RendezvousError::MalformedVariable { name, value, expected: PORT_FORM }),
            }
        };
        const PORT_FORM: &str = "a TCP port, 1 to 65535";
        let world_size = number("WORLD_SIZE", "the number of ranks, an integer of at least 1")?;
        if world_size == 0 {
            return Err(RendezvousError::MalformedVariable {
                name: "WORLD_SIZE",
                value: "0".into(),
                expected: "the number of ranks, an integer of at least 1",
            });
        }
        let rank = number("RANK", "this process's rank, an integer from 0 to WORLD_SIZE - 1")?;
        if rank >= world_size {
            return Err(RendezvousError::RankOutOfRange { rank, world_size });
        }
        let local_rank = number("LOCAL_RANK", "this process's index on its node, an integer from 0")?;
        let master_addr = text("MASTER_ADDR", "the host name or IP address of rank 0")?;
        if master_addr.trim().is_empty() {
            return Err(RendezvousError::MalformedVariable {
                name: "MASTER_ADDR",
                value: master_addr,
                expected: "the host name or IP address of rank 0",
            });
        }
        let port = match get(PORT_VARIABLE) {
            Some(value) => port_of(PORT_VARIABLE, value.to_string_lossy().into_owned())?,
            // torchrun's TCP store listens on MASTER_PORT: the rendezvous takes the next port.
            None => {
                let value = text("MASTER_PORT", PORT_FORM)?;
                match port_of("MASTER_PORT", value.clone())?.checked_add(1) {
                    Some(port) => port,
                    None => {
                        return Err(RendezvousError::MalformedVariable {
                            name: "MASTER_PORT",
                            value,
                            expected: "a TCP port below 65535 (the rendezvous listens on MASTER_PORT + 1), or \
                                       set MEMO_RENDEZVOUS_PORT",
                        })
                    }
                }
            }
        };
        let timeout = match get(TIMEOUT_VARIABLE) {
            None => DEFAULT_TIMEOUT,
            Some(value) => {
                let value = value.to_string_lossy().into_owned();
                match value.trim().parse::<f64>() {
                    Ok(seconds) if seconds > 0.0 && seconds <= 1e9 => Duration::from_secs_f64(seconds),
                    _ => {
                        return Err(RendezvousError::MalformedVariable {
                            name: TIMEOUT_VARIABLE,
                            value,
                            expected: "a number of seconds greater than 0",
                        })
                    }
                }
            }
        };
        Ok(TorchrunEnv { rank, world_size, local_rank, master_addr: master_addr.trim().to_string(), port, timeout })
    }

    /// Runs the exchange for this process ([`exchange`] with rank 0 bound to
    /// `MASTER_ADDR:port`).
    pub fn exchange(&self, make_id: impl FnOnce() -> Result<Vec<u8>, String>) -> Result<Vec<u8>, RendezvousError> {
        exchange(&self.master_addr, self.port, self.world_size, self.rank, self.timeout, make_id)
    }
}

/// Why the exchange failed. Each says what and, where there is one, the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RendezvousError {
    /// A variable the launcher sets is not set.
    MissingVariable {
        /// The variable.
        name: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// A variable does not hold what it should.
    MalformedVariable {
        /// The variable.
        name: &'static str,
        /// What it holds.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A rank outside `0..world_size` (from the environment, or in a hello rank 0 received).
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// `MASTER_ADDR:port` does not resolve to an address.
    Resolve {
        /// `host:port`.
        address: String,
        /// The resolver's message.
        error: String,
    },
    /// Rank 0 cannot listen on `MASTER_ADDR:port`.
    Bind {
        /// `host:port`.
        address: String,
        /// The system's message.
        error: String,
    },
    /// Rank 0: some ranks did not say hello within the timeout.
    RanksMissing {
        /// The ranks that did not.
        missing: Vec<usize>,
        /// The world size.
        world_size: usize,
        /// How long rank 0 waited.
        waited: Duration,
        /// Where it listened.
        address: String,
    },
    /// Rank 0: a hello with another world size.
    WorldSizeMismatch {
        /// The rank that sent it.
        rank: usize,
        /// Its world size.
        theirs: usize,
        /// Rank 0's.
        ours: usize,
    },
    /// Rank 0: two hellos claim the same rank.
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// The other side speaks another version of the protocol.
    ProtocolVersion {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// A rank other than 0 could not connect to rank 0 within the timeout.
    Unreachable {
        /// `host:port`.
        address: String,
        /// How long it tried.
        waited: Duration,
        /// The last connection error.
        last_error: String,
    },
    /// A rank other than 0 connected but got no reply within the timeout.
    NoReply {
        /// `host:port`.
        address: String,
        /// How long it waited in all.
        waited: Duration,
    },
    /// Rank 0 refused this rank or gave up, and said why.
    Refused {
        /// Rank 0's reason.
        reason: String,
    },
    /// The peer's bytes are not this protocol.
    NotARendezvous {
        /// `host:port` of the peer.
        address: String,
    },
    /// Rank 0's closure could not make the identifier.
    MakeId(String),
    /// A read or write failed.
    Io {
        /// What was being done.
        during: &'static str,
        /// The system's message.
        error: String,
    },
}

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::MissingVariable { name, expected } => write!(
                f,
                "{name} is not set: it should hold {expected}; start every rank with torchrun (or set RANK, WORLD_SIZE, \
                 LOCAL_RANK, MASTER_ADDR and MASTER_PORT as it does)"
            ),
            RendezvousError::MalformedVariable { name, value, expected } => {
                write!(f, "{name}={value:?} is not {expected}")
            }
            RendezvousError::RankOutOfRange { rank, world_size } => {
                write!(f, "rank {rank} is outside the world of {world_size} ranks (ranks are 0 to WORLD_SIZE - 1)")
            }
            RendezvousError::Resolve { address, error } => write!(f, "cannot resolve rank 0's address {address}: {error}"),
            RendezvousError::Bind { address, error } => write!(
                f,
                "rank 0 cannot listen on {address} ({error}): MASTER_ADDR must be an address of rank 0's host; if the \
                 port is in use (a launcher's own store may hold MASTER_PORT), give every rank the same free port in \
                 {PORT_VARIABLE}"
            ),
            RendezvousError::RanksMissing { missing, world_size, waited, address } => write!(
                f,
                "rank{} {} of {world_size} did not connect to rank 0 at {address} within {waited:?}: check that every \
                 rank was started with the same MASTER_ADDR, port and WORLD_SIZE, and that the port is reachable \
                 from every node",
                if missing.len() == 1 { "" } else { "s" },
                missing.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
            ),
            RendezvousError::WorldSizeMismatch { rank, theirs, ours } => write!(
                f,
                "rank {rank} says WORLD_SIZE={theirs}, rank 0 says WORLD_SIZE={ours}: start every rank with the same \
                 WORLD_SIZE"
            ),
            RendezvousError::DuplicateRank { rank } => {
                write!(f, "two processes claim rank {rank}: every process needs its own RANK")
            }
            RendezvousError::ProtocolVersion { ours, theirs } => write!(
                f,
                "the other side speaks rendezvous protocol version {theirs}, this build {ours}: run the same memo \
                 build on every rank"
            ),
            RendezvousError::Unreachable { address, waited, last_error } => write!(
                f,
                "rank 0 at {address} could not be reached within {waited:?} (last error: {last_error}): check that \
                 rank 0 is running, that MASTER_ADDR and the port are right, and that no firewall blocks the port"
            ),
            RendezvousError::NoReply { address, waited } => write!(
                f,
                "rank 0 at {address} accepted the connection but sent no identifier within {waited:?}: another rank is \
                 probably missing (rank 0's own error names it)"
            ),
            RendezvousError::Refused { reason } => write!(f, "rank 0 ended the rendezvous: {reason}"),
            RendezvousError::NotARendezvous { address } => {
                write!(f, "{address} answered with bytes that are not memo's rendezvous protocol: is the port right?")
            }
            RendezvousError::MakeId(why) => write!(f, "rank 0 could not make the identifier: {why}"),
            RendezvousError::Io { during, error } => write!(f, "rendezvous I/O failed while {during}: {error}"),
        }
    }
}

impl std::error::Error for RendezvousError {}

fn io(during: &'static str) -> impl FnOnce(std::io::Error) -> RendezvousError {
    move |error| RendezvousError::Io { during, error: error.to_string() }
}

/// The exchange on one rank: rank 0 listens on `host:port`, waits for every other rank, makes the
/// identifier with `make_id` and returns it; any other rank connects and returns what rank 0
/// sends. `timeout` bounds the whole exchange on every rank. With one rank, `make_id` is called
/// and nothing listens.
pub fn exchange(
    host: &str,
    port: u16,
    world_size: usize,
    rank: usize,
    timeout: Duration,
    make_id: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Vec<u8>, RendezvousError> {
    if rank >= world_size {
        return Err(RendezvousError::RankOutOfRange { rank, world_size });
    }
    if world_size == 1 {
        return make_id().map_err(RendezvousError::MakeId);
    }
    let address = format!("{host}:{port}");
    if rank == 0 {
        Root::bind(&address)?.serve(world_size, timeout, make_id)
    } else {
        join(&address, world_size, rank, timeout)
    }
}

/// Rank 0's listener, bound before the exchange (so a test can bind port 0 and give the others the
/// port it got).
pub struct Root {
    listener: TcpListener,
    address: String,
}

impl Root {
    /// Listens on `address` (`host:port`).
    pub fn bind(address: &str) -> Result<Root, RendezvousError> {
        let addrs = resolve(address)?;
        let listener = TcpListener::bind(&addrs[..])
            .map_err(|e| RendezvousError::Bind { address: address.to_string(), error: e.to_string() })?;
        listener.set_nonblocking(true).map_err(io("making the listener non-blocking"))?;
        // The address as bound (with the port the system chose for port 0), for messages.
        let address = listener.local_addr().map_or_else(|_| address.to_string(), |a| a.to_string());
        Ok(Root { listener, address })
    }

    /// Where it listens (with the port the system chose for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, RendezvousError> {
        self.listener.local_addr().map_err(io("reading the listener's address"))
    }

    /// Waits up to `timeout` for a hello from each of ranks `1..world_size`, then makes the
    /// identifier and sends it to each; returns it. On any failure the ranks already connected are
    /// told why before the error returns.
    pub fn serve(
        self,
        world_size: usize,
        timeout: Duration,
        make_id: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>, RendezvousError> {
        let start = Instant::now();
        let deadline = deadline_after(start, timeout);
        let mut ranks: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
        let mut joined = 1; // rank 0 itself
        let outcome = loop {
            if joined == world_size {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = (1..world_size).filter(|&r| ranks[r].is_none()).collect();
                break Err(RendezvousError::RanksMissing {
                    missing,
                    world_size,
                    waited: timeout,
                    address: self.address.clone(),
                });
            }
            let mut stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    std::thread::sleep(POLL.min(deadline - now));
                    continue;
                }
                Err(e) => break Err(io("accepting a connection")(e)),
            };
            // A rank writes its hello as soon as it connects: a peer that says nothing holds rank 0
            // at most HELLO_WAIT (and never past the deadline), then is dropped.
            let wait = HELLO_WAIT.min(deadline - now).max(Duration::from_millis(1));
            let hello = stream
                .set_nonblocking(false)
                .and_then(|()| stream.set_read_timeout(Some(wait)))
                .and_then(|()| read_exact(&mut stream, HELLO_BYTES));
            let Ok(hello) = hello else { continue };
            if hello[..8] != MAGIC {
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            }
            let version = u16::from_be_bytes([hello[8], hello[9]]);
            let theirs = u32::from_be_bytes([hello[10], hello[11], hello[12], hello[13]]) as usize;
            let rank = u32::from_be_bytes([hello[14], hello[15], hello[16], hello[17]]) as usize;
            let refused = if version != PROTOCOL_VERSION {
                Some(RendezvousError::ProtocolVersion { ours: PROTOCOL_VERSION, theirs: version })
            } else if theirs != world_size {
                Some(RendezvousError::WorldSizeMismatch { rank, theirs, ours: world_size })
            } else if rank >= world_size {
                Some(RendezvousError::RankOutOfRange { rank, world_size })
            } else if rank == 0 || ranks[rank].is_some() {
                Some(RendezvousError::DuplicateRank { rank })
            } else {
                None
            };
            if let Some(error) = refused {
                let _ = send_reply(&mut stream, STATUS_REFUSED, error.to_string().as_bytes());
                break Err(error);
            }
            ranks[rank] = Some(stream);
            joined += 1;
        };
        let result = outcome.and_then(|()| {
            let id = make_id().map_err(RendezvousError::MakeId)?;
            if id.len() > MAX_PAYLOAD {
                return Err(RendezvousError::MakeId(format!(
                    "the identifier is {} bytes, more than the protocol's {MAX_PAYLOAD}",
                    id.len()
                )));
            }
            Ok(id)
        });
        match result {
            Ok(id) => {
                for (rank, stream) in ranks.iter_mut().enumerate() {
                    if let Some(stream) = stream {
                        send_reply(stream, STATUS_OK, &id).map_err(|e| RendezvousError::Io {
                            during: "sending the identifier",
                            error: format!("to rank {rank}: {e}"),
                        })?;
                    }
                }
                Ok(id)
            }
            Err(error) => {
                let reason = error.to_string();
                for stream in ranks.iter_mut().flatten() {
                    let _ = send_reply(stream, STATUS_REFUSED, reason.as_bytes());
                }
                Err(error)
            }
        }
    }
}

/// A rank other than 0: connects to rank 0 (retrying until the deadline, since rank 0 may start
/// later), says hello, and waits for the reply.
fn join(address: &str, world_size: usize, rank: usize, timeout: Duration) -> Result<Vec<u8>, RendezvousError> {
    let start = Instant::now();
    let deadline = deadline_after(start, timeout);
    let (Ok(world), Ok(rank32)) = (u32::try_from(world_size), u32::try_from(rank)) else {
        return Err(RendezvousError::RankOutOfRange { rank, world_size });
    };
    let mut last_error = String::from("no address tried");
    let mut stream = 'connect: loop {
        // Resolved on every attempt: a host name may appear in DNS after the job starts.
        match resolve(address) {
            Ok(addrs) => {
                for addr in &addrs {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    match TcpStream::connect_timeout(addr, deadline - now) {
                        Ok(stream) => break 'connect stream,
                        Err(e) => last_error = e.to_string(),
                    }
                }
            }
            Err(e) => last_error = e.to_string(),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(RendezvousError::Unreachable { address: address.to_string(), waited: timeout, last_error });
        }
        std::thread::sleep(POLL.min(deadline - now));
    };
    let mut hello = Vec::with_capacity(HELLO_BYTES);
    hello.extend_from_slice(&MAGIC);
    hello.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    hello.extend_from_slice(&world.to_be_bytes());
    hello.extend_from_slice(&rank32.to_be_bytes());
    stream.write_all(&hello).map_err(io("sending the hello to rank 0"))?;
    let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(remaining)).map_err(io("setting the read timeout"))?;
    let timed_out = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    let header = match read_exact(&mut stream, REPLY_HEADER_BYTES) {
        Ok(header) => header,
        Err(e) if timed_out(&e) => {
            return Err(RendezvousError::NoReply { address: address.to_string(), waited: timeout })
        }
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
            return Err(RendezvousError::Refused {
                reason: "rank 0 closed the connection without a reply (it stopped or gave up)".into(),
            })
        }
        Err(e) => return Err(io("reading rank 0's reply")(e)),
    };
    if header[..8] != MAGIC {
        return Err(RendezvousError::NotARendezvous { address: address.to_string() });
    }
    let version = u16::from_be_bytes([header[8], header[9]]);
    if version != PROTOCOL_VERSION {
        return Err(RendezvousError::ProtocolVersion { ours: PROTOCOL_VERSION, theirs: version });
    }
    let status = header[10];
    let length = u32::from_be_bytes([header[11], header[12], header[13], header[14]]) as usize;
    if length > MAX_PAYLOAD {
        return Err(RendezvousError::NotARendezvous { address: address.to_string() });
    }
    let payload = match read_exact(&mut stream, length) {
        Ok(payload) => payload,
        Err(e) if timed_out(&e) => {
            return Err(RendezvousError::NoReply { address: address.to_string(), waited: timeout })
        }
        Err(e) => return Err(io("reading rank 0's reply")(e)),
    };
    match status {
        STATUS_OK => Ok(payload),
        _ => Err(RendezvousError::Refused { reason: String::from_utf8_lossy(&payload).into_owned() }),
    }
}

/// `start + timeout`, or about 30 years on for a timeout too long to add (`Duration::MAX`: wait
/// "forever" without overflowing).
fn deadline_after(start: Instant, timeout: Duration) -> Instant {
    start.checked_add(timeout).or_else(|| start.checked_add(Duration::from_secs(1 << 30))).unwrap_or(start)
}

fn resolve(address: &str) -> Result<Vec<SocketAddr>, RendezvousError> {
    let addrs: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|e| RendezvousError::Resolve { address: address.to_string(), error: e.to_string() })?
        .collect();
    if addrs.is_empty() {
        return Err(RendezvousError::Resolve { address: address.to_string(), error: "no address".into() });
    }
    Ok(addrs)
}

fn read_exact(stream: &mut TcpStream, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buffer = vec![0; len];
    stream.read_exact(&mut buffer)?;
    Ok(buffer)
}

fn send_reply(stream: &mut TcpStream, status: u8, payload: &[u8]) -> std::io::Result<()> {
    let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
    let mut reply = Vec::with_capacity(REPLY_HEADER_BYTES + payload.len());
    reply.extend_from_slice(&MAGIC);
    reply.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    reply.push(status);
    reply.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    reply.extend_from_slice(payload);
    stream.write_all(&reply)?;
    stream.flush()
}

#[cfg(test)]
mod tests;
