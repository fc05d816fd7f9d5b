//! Arbitrary bytes into the snapshot decoder: a typed error or a snapshot, never a
//! panic, never an allocation beyond the input's size. Four ways in, so the fuzzer
//! reaches the entry parser without having to forge a checksum: the raw bytes; the raw
//! bytes sealed with their checksum; and the bytes behind a valid magic and each version
//! it reads (1, and 2 whose entries carry correlation ids), sealed. Whatever decodes
//! holds only well-formed keys and correlation ids.
#![no_main]

use idemcache::snapshot::read_bytes;
use idemcache::{CorrelationId, Key};
use libfuzzer_sys::fuzz_target;
use xxhash_rust::xxh3::xxh3_64;

fn sealed(mut bytes: Vec<u8>) -> Vec<u8> {
    let sum = xxh3_64(&bytes);
    bytes.extend_from_slice(&sum.to_be_bytes());
    bytes
}

fuzz_target!(|data: &[u8]| {
    let _ = read_bytes(data);
    let framed = |version: &[u8]| [&b"IDEMSNAP"[..], version, data].concat();
    let inputs = [sealed(data.to_vec()), sealed(framed(b"\x00\x01")), sealed(framed(b"\x00\x02"))];
    for bytes in inputs {
        if let Ok(snapshot) = read_bytes(&bytes) {
            for entry in &snapshot.entries {
                assert_eq!(Key::from_bytes(entry.key.as_bytes()).as_ref(), Ok(&entry.key));
                if let Some(id) = &entry.correlation_id {
                    assert_eq!(CorrelationId::new(id.as_str()).as_ref(), Ok(id));
                }
            }
        }
    }
});
