//! The protobuf encoding of the few messages an event file of scalars needs, and a decoder of
//! the same (for tests and tools that check what was written).
//!
//! Field numbers are those of TensorFlow's `event.proto` and `summary.proto` (checked against
//! TensorBoard 2.21's `event_pb2` / `summary_pb2`). Wire types: 0 varint, 1 64-bit, 2
//! length-delimited, 5 32-bit.

const WIRE_VARINT: u8 = 0;
const WIRE_64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_32: u8 = 5;

// Event
const EVENT_WALL_TIME: u32 = 1;
const EVENT_STEP: u32 = 2;
const EVENT_FILE_VERSION: u32 = 3;
const EVENT_SUMMARY: u32 = 5;
const EVENT_SESSION_LOG: u32 = 7;
// Summary / Summary.Value
const SUMMARY_VALUE: u32 = 1;
const VALUE_TAG: u32 = 1;
const VALUE_SIMPLE_VALUE: u32 = 2;
// SessionLog
const SESSION_LOG_STATUS: u32 = 1;
const SESSION_STATUS_START: u64 = 1;

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    varint(buf, ((field as u64) << 3) | wire as u64);
}

fn bytes_field(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(buf, field, WIRE_LEN);
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// `Event { wall_time, step, <what> }`.
fn event(wall_time: f64, step: i64, what: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::new();
    key(&mut b, EVENT_WALL_TIME, WIRE_64);
    b.extend_from_slice(&wall_time.to_le_bytes());
    key(&mut b, EVENT_STEP, WIRE_VARINT);
    // int64 is a two's-complement varint.
    varint(&mut b, step as u64);
    what(&mut b);
    b
}

/// The first event of a file.
pub fn file_version_event(wall_time: f64, version: &str) -> Vec<u8> {
    event(wall_time, 0, |b| {
        bytes_field(b, EVENT_FILE_VERSION, version.as_bytes())
    })
}

/// An event whose summary holds one `simple_value` per tag.
pub fn scalars_event(wall_time: f64, step: i64, values: &[(&str, f32)]) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, v) in values {
        let mut value = Vec::new();
        bytes_field(&mut value, VALUE_TAG, tag.as_bytes());
        key(&mut value, VALUE_SIMPLE_VALUE, WIRE_32);
        value.extend_from_slice(&v.to_le_bytes());
        bytes_field(&mut summary, SUMMARY_VALUE, &value);
    }
    event(wall_time, step, |b| bytes_field(b, EVENT_SUMMARY, &summary))
}

/// `Event { session_log: { status: START } }` at `step`.
pub fn session_start_event(wall_time: f64, step: i64) -> Vec<u8> {
    let mut log = Vec::new();
    key(&mut log, SESSION_LOG_STATUS, WIRE_VARINT);
    varint(&mut log, SESSION_STATUS_START);
    event(wall_time, step, |b| bytes_field(b, EVENT_SESSION_LOG, &log))
}

/// What [`decode_event`] understands of an event.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecodedEvent {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    /// `(tag, simple_value)` of the summary, in order.
    pub scalars: Vec<(String, f32)>,
    /// A `SessionLog` with status START.
    pub session_start: bool,
}

/// Decodes an event written by this module (other fields are skipped); `None` if malformed.
pub fn decode_event(data: &[u8]) -> Option<DecodedEvent> {
    let mut e = DecodedEvent::default();
    for (field, value) in fields(data)? {
        match (field, value) {
            (EVENT_WALL_TIME, Value::Fixed64(v)) => e.wall_time = f64::from_le_bytes(v),
            (EVENT_STEP, Value::Varint(v)) => e.step = v as i64,
            (EVENT_FILE_VERSION, Value::Bytes(b)) => {
                e.file_version = Some(String::from_utf8(b.to_vec()).ok()?)
            }
            (EVENT_SUMMARY, Value::Bytes(summary)) => {
                for (f, v) in fields(summary)? {
                    if let (SUMMARY_VALUE, Value::Bytes(value)) = (f, v) {
                        let (mut tag, mut simple) = (None, None);
                        for (f, v) in fields(value)? {
                            match (f, v) {
                                (VALUE_TAG, Value::Bytes(t)) => {
                                    tag = Some(String::from_utf8(t.to_vec()).ok()?)
                                }
                                (VALUE_SIMPLE_VALUE, Value::Fixed32(x)) => {
                                    simple = Some(f32::from_le_bytes(x))
                                }
                                _ => {}
                            }
                        }
                        if let (Some(t), Some(x)) = (tag, simple) {
                            e.scalars.push((t, x));
                        }
                    }
                }
            }
            (EVENT_SESSION_LOG, Value::Bytes(log)) => {
                e.session_start = fields(log)?.iter().any(|(f, v)| {
                    *f == SESSION_LOG_STATUS && matches!(v, Value::Varint(SESSION_STATUS_START))
                });
            }
            _ => {}
        }
    }
    Some(e)
}

enum Value<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The `(field number, value)` pairs of a message.
fn fields(mut data: &[u8]) -> Option<Vec<(u32, Value<'_>)>> {
    fn read_varint(data: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = data.split_first()?;
            *data = rest;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }
    fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if data.len() < n {
            return None;
        }
        let (head, rest) = data.split_at(n);
        *data = rest;
        Some(head)
    }
    let mut out = Vec::new();
    while !data.is_empty() {
        let k = read_varint(&mut data)?;
        let field = (k >> 3) as u32;
        let value = match (k & 7) as u8 {
            WIRE_VARINT => Value::Varint(read_varint(&mut data)?),
            WIRE_64 => Value::Fixed64(take(&mut data, 8)?.try_into().ok()?),
            WIRE_LEN => {
                let n = read_varint(&mut data)? as usize;
                Value::Bytes(take(&mut data, n)?)
            }
            WIRE_32 => Value::Fixed32(take(&mut data, 4)?.try_into().ok()?),
            _ => return None,
        };
        out.push((field, value));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_events_have_the_bytes_tensorflow_writes() {
        // TensorBoard 2.21's event_pb2.Event(wall_time=1.5, step=3, summary=Summary(value=[
        // Value(tag="a", simple_value=0.5)])).SerializeToString()
        assert_eq!(
            scalars_event(1.5, 3, &[("a", 0.5)]),
            [
                0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, // wall_time = 1.5
                0x10, 0x03, // step = 3
                0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, b'a', 0x15, 0, 0, 0, 0x3f, // summary
            ]
        );
        // ... and Event(wall_time=1.5, step=3, session_log=SessionLog(status=START)).
        assert_eq!(
            session_start_event(1.5, 3),
            [0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x03, 0x3a, 0x02, 0x08, 0x01]
        );
        // A negative step is a ten-byte varint.
        assert_eq!(decode_event(&scalars_event(0.0, -1, &[])).unwrap().step, -1);
    }
}
