//! A minimal pickle writer (protocol 2): dicts, lists, tuples, strings,
//! integers of any u64/i64 value and booleans — what a PyTorch
//! memory snapshot is made of. No memo: every object is written once.

/// A Python value.
#[derive(Debug, Clone, PartialEq)]
pub enum Py {
    Bool(bool),
    Int(i128),
    Str(String),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    /// Keys are strings; insertion order is kept (Python dicts keep it too).
    Dict(Vec<(String, Py)>),
}

impl Py {
    pub fn str(s: impl Into<String>) -> Py {
        Py::Str(s.into())
    }
    pub fn int(v: impl Into<i128>) -> Py {
        Py::Int(v.into())
    }
    pub fn dict(items: Vec<(&str, Py)>) -> Py {
        Py::Dict(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }
}

/// The pickle of `v` (protocol 2, as `pickle.load` reads in any Python 3).
pub fn dumps(v: &Py) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    write(&mut out, v);
    out.push(b'.');
    out
}

const BATCH: usize = 1000;

fn write(o: &mut Vec<u8>, v: &Py) {
    match v {
        Py::Bool(true) => o.push(0x88),
        Py::Bool(false) => o.push(0x89),
        Py::Int(i) => int(o, *i),
        Py::Str(s) => {
            o.push(b'X');
            o.extend_from_slice(&(s.len() as u32).to_le_bytes());
            o.extend_from_slice(s.as_bytes());
        }
        Py::List(items) => {
            o.push(b']');
            for chunk in items.chunks(BATCH) {
                o.push(b'(');
                for x in chunk {
                    write(o, x);
                }
                o.push(b'e');
            }
        }
        Py::Tuple(items) => match items.len() {
            0 => o.push(b')'),
            2 => {
                write(o, &items[0]);
                write(o, &items[1]);
                o.push(0x86);
            }
            _ => {
                o.push(b'(');
                for x in items {
                    write(o, x);
                }
                o.push(b't');
            }
        },
        Py::Dict(items) => {
            o.push(b'}');
            for chunk in items.chunks(BATCH) {
                o.push(b'(');
                for (k, x) in chunk {
                    write(o, &Py::Str(k.clone()));
                    write(o, x);
                }
                o.push(b'u');
            }
        }
    }
}

fn int(o: &mut Vec<u8>, i: i128) {
    if let Ok(v) = i32::try_from(i) {
        o.push(b'J');
        o.extend_from_slice(&v.to_le_bytes());
        return;
    }
    // LONG1: n bytes of little-endian two's complement, as short as the
    // sign allows
    let bytes = i.to_le_bytes();
    let mut n = bytes.len();
    while n > 1 {
        let top = bytes[n - 1];
        let next_sign = bytes[n - 2] & 0x80;
        if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
            n -= 1;
        } else {
            break;
        }
    }
    o.push(0x8a);
    o.push(n as u8);
    o.extend_from_slice(&bytes[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_encodings() {
        assert_eq!(dumps(&Py::int(1)), b"\x80\x02J\x01\x00\x00\x00.");
        // 2**32 as LONG1: 5 bytes
        assert_eq!(
            dumps(&Py::int(1i64 << 32)),
            b"\x80\x02\x8a\x05\x00\x00\x00\x00\x01."
        );
        // 2**63: the sign needs a 9th byte
        assert_eq!(
            dumps(&Py::int(1u64 << 63)),
            b"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."
        );
        assert_eq!(
            dumps(&Py::int(-(1i64 << 40))),
            b"\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff."
        );
        assert_eq!(
            dumps(&Py::Tuple(vec![Py::int(0), Py::int(0)])),
            b"\x80\x02J\x00\x00\x00\x00J\x00\x00\x00\x00\x86."
        );
        assert_eq!(
            dumps(&Py::dict(vec![("a", Py::Bool(true))])),
            b"\x80\x02}(X\x01\x00\x00\x00a\x88u."
        );
    }
}
