//! libFuzzer target for the RESP decoder: arbitrary bytes, arbitrary split points.
//!
//! Input layout: byte 0 = number of cut points (mod 16), then that many little-endian u16 cut
//! positions, then the bytes fed to the decoder. Inputs up to 256 data bytes are also checked at
//! every single cut and byte by byte. See `check::check` for the properties.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../src/check.rs"]
mod check;
#[path = "../../src/codec/resp/mod.rs"]
#[allow(dead_code, unused_imports)]
mod resp;

fuzz_target!(|input: &[u8]| {
    let Some((&n, rest)) = input.split_first() else { return };
    let n = usize::from(n % 16).min(rest.len() / 2);
    let (cut_bytes, data) = rest.split_at(2 * n);
    let cuts: Vec<usize> = cut_bytes
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (data.len() + 1))
        .collect();
    check::check(data, &cuts, data.len() <= 256);
});
