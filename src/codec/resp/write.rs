//! RESP written: the commands this module sends, arguments appended to an output buffer as
//! they are encoded, integers written in place without `core::fmt`.

/// Appends a RESP array header (`*n\r\n`).
pub fn put_array_len(out: &mut Vec<u8>, n: usize) {
    put_len_line(out, b'*', n);
}

/// Appends one bulk-string argument. Arguments are always length-prefixed, so no byte in a key
/// (CR, LF, NUL, spaces) can change the command's framing.
pub fn put_bulk(out: &mut Vec<u8>, arg: &[u8]) {
    // Not `put_bulk_parts` of one piece: without its pieces' sum and loop this inlines where
    // a script call's short arguments are written (`EVALSHA`, the hash, an algorithm's
    // letter), which took `put_bulk_parts` from 4.2 calls a request to 1 on the exact path.
    put_len_line(out, b'$', arg.len());
    out.extend_from_slice(arg);
    out.extend_from_slice(b"\r\n");
}

/// Appends one bulk-string argument made of several pieces, without joining them first.
pub fn put_bulk_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + 24);
    // Empty pieces (a key's absent prefix) skipped: each append of a piece whose length the
    // compiler does not know is a `memcpy` call.
    put_len_line(out, b'$', len);
    for p in parts.iter().filter(|p| !p.is_empty()) {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends an integer as a bulk-string argument, without a heap allocation. The whole
/// argument is assembled on the stack, from its end (its digits first, then their count before
/// them), and appended at once: a decision's arguments are mostly integers, and going through
/// [`put_bulk_parts`] wrote each in five appends and formatted its length as a second number.
pub fn put_bulk_int(out: &mut Vec<u8>, v: u64) {
    // `$`, at most two digits of length (20), CRLF, the digits, CRLF.
    let mut arg = [0u8; 27];
    arg[25..].copy_from_slice(b"\r\n");
    let start = digits_before(v, &mut arg, 25);
    let at = digits_before((25 - start) as u64, &mut arg, start - 2) - 1;
    arg[start - 2..start].copy_from_slice(b"\r\n");
    arg[at] = b'$';
    out.extend_from_slice(&arg[at..]);
}

/// A command of bulk-string arguments, kept to be sent (again) later.
pub fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    put_command(&mut out, args);
    out
}

/// Appends a command of bulk-string arguments: written where it is sent from, not assembled
/// apart and copied.
pub fn put_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    put_array_len(out, args.len());
    for arg in args {
        put_bulk(out, arg);
    }
}

/// An error reply of `text` (one line), as Redis would send it: a `MOVED` or `ASK` reply is
/// handed on rewritten with the node's own host where Redis left it out.
pub fn error_reply(text: &[u8]) -> Vec<u8> {
    [b"-", text, b"\r\n"].concat()
}

/// `AUTH password` or, with an ACL user, `AUTH user password`.
pub fn auth_command(user: Option<&str>, password: &str) -> Vec<u8> {
    match user {
        Some(user) => command(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
        None => command(&[b"AUTH", password.as_bytes()]),
    }
}

/// Appends `<kind><n>\r\n`, assembled first and appended at once: written as its three parts,
/// a bulk string's length line was three `memcpy` calls.
fn put_len_line(out: &mut Vec<u8>, kind: u8, n: usize) {
    // The kind, at most 20 digits, CRLF.
    let mut line = [0u8; 23];
    line[21..].copy_from_slice(b"\r\n");
    let at = digits_before(n as u64, &mut line, 21) - 1;
    line[at] = kind;
    out.extend_from_slice(&line[at..]);
}

/// `v` in decimal, at the end of `buf`.
pub fn fmt_u64(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let at = digits_before(v, buf, 20);
    &buf[at..]
}

/// Writes `v` in decimal into `buf` just before `end`, and returns where it starts: a number
/// written into the place it is sent from, not formatted apart and copied. Two digits a
/// division: numbers are written on every request (header values, script arguments), and a
/// division is most of a digit's cost. `end` must leave room for 20 digits (or `v`'s).
#[inline(always)]
fn digits_before<const N: usize>(mut v: u64, buf: &mut [u8; N], end: usize) -> usize {
    const PAIRS: [u8; 200] = {
        let mut t = [0; 200];
        let mut n = 0;
        while n < 100 {
            (t[2 * n], t[2 * n + 1]) = (b'0' + (n / 10) as u8, b'0' + (n % 10) as u8);
            n += 1;
        }
        t
    };
    let mut i = end;
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        let pair = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    i
}
