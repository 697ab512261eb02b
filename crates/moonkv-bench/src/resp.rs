//! The Redis comparator of `bench store`: a minimal blocking RESP2 client (SET, GET, DEL) and
//! the Redis side of a cell — the same object size and number of clients as the moonkv side,
//! one blocking connection per thread, each thread with its own key.

use super::histogram::Histogram;
use super::store::{Run, StoreOp};
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Values up to this size are sent in one write together with the command.
const COALESCE_BYTES: usize = 16 << 10;

/// One connection to a Redis server.
pub struct Redis {
    stream: BufReader<TcpStream>,
    line: Vec<u8>,
}

impl Redis {
    /// Connects with `TCP_NODELAY`, as the data plane does.
    pub fn connect(addr: &str) -> io::Result<Redis> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Redis {
            stream: BufReader::with_capacity(64 << 10, stream),
            line: Vec::with_capacity(64),
        })
    }

    /// `SET key value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        let mut head = command_head(&[b"SET", key.as_bytes()], 1);
        head.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
        let out = self.stream.get_mut();
        if value.len() <= COALESCE_BYTES {
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
            out.write_all(&head)?;
        } else {
            out.write_all(&head)?;
            out.write_all(value)?;
            out.write_all(b"\r\n")?;
        }
        match self.reply_line()?.as_slice() {
            b"+OK" => Ok(()),
            other => Err(unexpected("SET", other)),
        }
    }

    /// `GET key` into `buf`; returns the value's length, `None` for a missing key. A value
    /// longer than `buf` is an error.
    pub fn get_into(&mut self, key: &str, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let request = command_head(&[b"GET", key.as_bytes()], 0);
        self.stream.get_mut().write_all(&request)?;
        let line = self.reply_line()?;
        let length = match line.strip_prefix(b"$") {
            Some(b"-1") => return Ok(None),
            Some(digits) => parse_length(digits).ok_or_else(|| unexpected("GET", &line))?,
            None => return Err(unexpected("GET", &line)),
        };
        let target = buf.get_mut(..length).ok_or_else(|| {
            io::Error::other(format!("GET returned {length} bytes, more than the buffer"))
        })?;
        io::Read::read_exact(&mut self.stream, target)?;
        let mut crlf = [0u8; 2];
        io::Read::read_exact(&mut self.stream, &mut crlf)?;
        Ok(Some(length))
    }

    /// `DEL key…`; returns how many existed.
    pub fn del(&mut self, keys: &[String]) -> io::Result<u64> {
        let mut args: Vec<&[u8]> = vec![b"DEL"];
        args.extend(keys.iter().map(|k| k.as_bytes()));
        let request = command_head(&args, 0);
        self.stream.get_mut().write_all(&request)?;
        let line = self.reply_line()?;
        line.strip_prefix(b":")
            .and_then(parse_length)
            .map(|n| n as u64)
            .ok_or_else(|| unexpected("DEL", &line))
    }

    /// One reply line without its CRLF; an error reply (`-…`) becomes an error.
    fn reply_line(&mut self) -> io::Result<Vec<u8>> {
        self.line.clear();
        self.stream.read_until(b'\n', &mut self.line)?;
        if !self.line.ends_with(b"\r\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "Redis closed the connection mid-reply",
            ));
        }
        self.line.truncate(self.line.len() - 2);
        if let Some(message) = self.line.strip_prefix(b"-") {
            return Err(io::Error::other(format!(
                "Redis error: {}",
                String::from_utf8_lossy(message)
            )));
        }
        Ok(self.line.clone())
    }
}

/// `*N` then each argument as a bulk string; `extra` more arguments follow from the caller.
fn command_head(args: &[&[u8]], extra: usize) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len() + extra).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn parse_length(digits: &[u8]) -> Option<usize> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn unexpected(command: &str, reply: &[u8]) -> io::Error {
    io::Error::other(format!(
        "unexpected reply to {command}: {:?}",
        String::from_utf8_lossy(&reply[..reply.len().min(64)])
    ))
}

/// Writes every key once (before a GET cell), `size` bytes of the pattern each.
pub fn prepare(addr: &str, keys: &[String], size: usize) -> anyhow::Result<()> {
    let mut redis = Redis::connect(addr)?;
    let value = super::store::pattern(size);
    for key in keys {
        redis.set(key, &value)?;
    }
    Ok(())
}

/// Deletes the keys a cell used.
pub fn cleanup(addr: &str, keys: &[String]) -> anyhow::Result<()> {
    Redis::connect(addr)?.del(keys)?;
    Ok(())
}

/// One run of a cell: one thread and connection per key, SET (put) or GET (get) of `size`
/// bytes in a loop for `duration`.
pub fn run_cell(
    addr: &str,
    op: StoreOp,
    size: usize,
    keys: &[String],
    duration: Duration,
) -> anyhow::Result<Run> {
    let connections = keys
        .iter()
        .map(|_| Redis::connect(addr))
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| anyhow::anyhow!("cannot connect to Redis at {addr}: {e}"))?;
    let start_line = Barrier::new(keys.len());
    let workers: Vec<anyhow::Result<(u64, Duration, Histogram)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = connections
            .into_iter()
            .zip(keys)
            .map(|(redis, key)| {
                let start_line = &start_line;
                scope.spawn(move || worker(redis, op, key, size, duration, start_line))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("Redis client panicked")))
            })
            .collect()
    });
    Run::from_workers(size, workers)
}

fn worker(
    mut redis: Redis,
    op: StoreOp,
    key: &str,
    size: usize,
    duration: Duration,
    start_line: &Barrier,
) -> anyhow::Result<(u64, Duration, Histogram)> {
    let mut buf = super::store::pattern(size);
    let mut latency = Histogram::default();
    start_line.wait();
    let started = Instant::now();
    let deadline = started + duration;
    let (mut now, mut ops) = (started, 0u64);
    while now < deadline {
        match op {
            StoreOp::Put => redis.set(key, &buf)?,
            StoreOp::Get => {
                let got = redis.get_into(key, &mut buf)?;
                anyhow::ensure!(got == Some(size), "GET {key} returned {got:?} bytes");
            }
        }
        let after = Instant::now();
        latency.record(after - now);
        now = after;
        ops += 1;
    }
    Ok((ops, now - started, latency))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        assert_eq!(
            command_head(&[b"GET", b"k1"], 0),
            b"*2\r\n$3\r\nGET\r\n$2\r\nk1\r\n"
        );
        assert_eq!(
            command_head(&[b"SET", b"k"], 1),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n"
        );
        assert_eq!(parse_length(b"1048576"), Some(1 << 20));
        assert_eq!(parse_length(b"x"), None);
    }

    /// A fake server answering one SET, one GET of 5 bytes, one missing GET and one DEL.
    #[test]
    fn replies_are_parsed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"+OK\r\n$5\r\nhello\r\n$-1\r\n:2\r\n").unwrap();
            let mut seen = Vec::new();
            let _ = io::Read::read_to_end(&mut s, &mut seen);
            seen
        });
        let mut redis = Redis::connect(&addr).unwrap();
        redis.set("k", b"hello").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(redis.get_into("k", &mut buf).unwrap(), Some(5));
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(redis.get_into("gone", &mut buf).unwrap(), None);
        assert_eq!(redis.del(&["a".into(), "b".into()]).unwrap(), 2);
        drop(redis);
        let seen = server.join().unwrap();
        assert!(seen.starts_with(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n"));
    }
}
