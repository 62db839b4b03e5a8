//! The RESP decoder's properties (`src/check.rs`) without libFuzzer: random, structure-aware
//! inputs (valid pipelined replies of every type, then corrupted) with random cut points, for a
//! bounded time. Runs on stable Rust with no instrumentation; `fuzz/run.sh` falls back to it
//! when cargo-fuzz is not available.
//!
//!     cargo run --release --example resp_prop -- [seconds] [seed]

#[path = "../src/check.rs"]
mod check;
#[path = "../../src/codec/resp/mod.rs"]
#[allow(dead_code, unused_imports)]
mod resp;

use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Numbers where decoders go wrong: signs, zero, limits, overflow.
#[rustfmt::skip]
const NUMBERS: &[&str] = &[
    "0", "1", "-1", "-2", "-0", "00", "4", "16", "1048576", "1048577", "65536", "65537",
    "9223372036854775807", "-9223372036854775808", "9223372036854775808",
    "99999999999999999999", "1a", "", "+1", " 1",
];

/// resp.rs's MAX_LINE_LEN (private there): the longest header or status line it accepts.
const MAX_LINE_LEN: usize = 4096;

fn line_text(rng: &mut Rng, out: &mut Vec<u8>) {
    let len = if rng.chance(16) { MAX_LINE_LEN - 3 + rng.below(6) } else { rng.below(12) };
    for _ in 0..len {
        out.push(match rng.below(8) {
            0 => b'\r',
            1 => b' ',
            _ => b'a' + rng.below(26) as u8,
        });
    }
}

/// Appends one reply, valid unless `rng` decides to bend a length or a number.
fn reply(rng: &mut Rng, out: &mut Vec<u8>, depth: usize) {
    let kind = if depth >= 10 { rng.below(5) } else { rng.below(7) };
    match kind {
        0 => {
            out.push(b'+');
            line_text(rng, out);
            out.extend_from_slice(b"\r\n");
        }
        1 => {
            out.push(b'-');
            out.extend_from_slice(
                [&b"ERR x"[..], b"NOSCRIPT No matching script", b"WRONGTYPE", b"BUSY"]
                    [rng.below(4)],
            );
            out.extend_from_slice(b"\r\n");
        }
        2 => {
            out.push(b':');
            if rng.chance(3) {
                out.extend_from_slice(NUMBERS[rng.below(NUMBERS.len())].as_bytes());
            } else {
                out.extend_from_slice((rng.next() as i64 >> rng.below(64)).to_string().as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        3 => {
            let len = match rng.below(10) {
                0 => resp::MAX_BULK_LEN + rng.below(2),
                1 => 4096 + rng.below(8),
                _ => rng.below(40),
            };
            if rng.chance(8) {
                out.push(b'$');
                out.extend_from_slice(NUMBERS[rng.below(NUMBERS.len())].as_bytes());
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend_from_slice(format!("${len}\r\n").as_bytes());
            }
            let start = out.len();
            out.resize(start + len, b'x');
            for b in &mut out[start..start + len.min(64)] {
                *b = rng.next() as u8;
            }
            out.extend_from_slice(b"\r\n");
        }
        4 => out.extend_from_slice(if rng.chance(2) { b"$-1\r\n" } else { b"*-1\r\n" }),
        _ => {
            let n = if rng.chance(20) { 65536 + rng.below(2) } else { rng.below(5) };
            out.extend_from_slice(format!("*{n}\r\n").as_bytes());
            for _ in 0..n.min(6) {
                reply(rng, out, depth + 1);
            }
        }
    }
}

/// A few random edits: flipped bytes, inserted CR/LF or type bytes, cut or repeated spans.
fn corrupt(rng: &mut Rng, buf: &mut Vec<u8>) {
    for _ in 0..rng.below(4) {
        if buf.is_empty() {
            return;
        }
        let i = rng.below(buf.len());
        match rng.below(5) {
            0 => buf[i] = rng.next() as u8,
            1 => buf.insert(i, b"\r\n*$:+-0"[rng.below(8)]),
            2 => {
                buf.remove(i);
            }
            3 => buf.truncate(i),
            _ => {
                let j = (i + rng.below(16)).min(buf.len());
                let span = buf[i..j].to_vec();
                buf.splice(i..i, span);
            }
        }
    }
}

/// Random cut points, half of them next to a line end, where framing decisions are made.
fn cut_points(rng: &mut Rng, buf: &[u8]) -> Vec<usize> {
    let ends: Vec<usize> =
        buf.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i).collect();
    (0..rng.below(8))
        .map(|_| {
            if !ends.is_empty() && rng.chance(2) {
                (ends[rng.below(ends.len())] + rng.below(5)).saturating_sub(2).min(buf.len())
            } else {
                rng.below(buf.len() + 1)
            }
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
    }) | 1;
    println!("resp_prop: {secs} s, seed {seed}");
    let mut rng = Rng(seed);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut runs: u64 = 0;
    while Instant::now() < deadline {
        for _ in 0..64 {
            let mut buf = Vec::new();
            for _ in 0..1 + rng.below(4) {
                reply(&mut rng, &mut buf, 0);
            }
            if !rng.chance(4) {
                corrupt(&mut rng, &mut buf);
            }
            let cuts = cut_points(&mut rng, &buf);
            let small = buf.len() <= 256;
            if let Err(panic) = std::panic::catch_unwind(|| check::check(&buf, &cuts, small)) {
                eprintln!("property violated (seed {seed}, run {runs}) on {} bytes:", buf.len());
                eprintln!("{:?}", String::from_utf8_lossy(&buf[..buf.len().min(2048)]));
                eprintln!("cuts {cuts:?}");
                let dir =
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/resp_prop");
                let file = dir.join(format!("failure-{seed}-{runs}"));
                let mut saved = vec![cuts.len() as u8];
                cuts.iter().for_each(|&c| saved.extend_from_slice(&(c as u16).to_le_bytes()));
                saved.extend_from_slice(&buf);
                if std::fs::create_dir_all(&dir)
                    .and_then(|()| std::fs::write(&file, &saved))
                    .is_ok()
                {
                    eprintln!("saved as {} (the libFuzzer target's input format)", file.display());
                }
                std::panic::resume_unwind(panic);
            }
            runs += 1;
        }
    }
    println!("resp_prop: {runs} inputs, no property violated");
}
