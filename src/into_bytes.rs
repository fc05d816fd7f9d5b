//! [`IntoBytes`]: what `complete` and `resolve` accept as a result, so that a caller
//! passes what it has (`b"..."`, a `Vec`, a `String`, [`Bytes`]) without converting.
//!
//! Invariant: owned buffers (`Vec`, `String`, `Box<[u8]>`, `Bytes`, `BytesMut`) are
//! taken without a copy; borrowed ones (`&[u8]`, `&str`, `&[u8; N]`) are copied once, which the cache
//! does anyway for a small result (it packs them into its arena). For a `'static` buffer
//! kept without a copy, pass `Bytes::from_static`.

use bytes::Bytes;

/// A result `complete` or `resolve` can record: converted into [`Bytes`].
pub trait IntoBytes {
    /// The result as `Bytes`.
    fn into_bytes(self) -> Bytes;
}

impl IntoBytes for Bytes {
    fn into_bytes(self) -> Bytes {
        self
    }
}

impl IntoBytes for bytes::BytesMut {
    fn into_bytes(self) -> Bytes {
        self.freeze()
    }
}

impl IntoBytes for Vec<u8> {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for Box<[u8]> {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for String {
    fn into_bytes(self) -> Bytes {
        Bytes::from(self)
    }
}

impl IntoBytes for &[u8] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl<const N: usize> IntoBytes for &[u8; N] {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self)
    }
}

impl IntoBytes for &str {
    fn into_bytes(self) -> Bytes {
        Bytes::copy_from_slice(self.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_gives_the_same_bytes() {
        let want = Bytes::from_static(b"ok");
        assert_eq!(b"ok".into_bytes(), want);
        assert_eq!((&b"ok"[..]).into_bytes(), want);
        assert_eq!("ok".into_bytes(), want);
        // Through the trait: `String` has an inherent `into_bytes` (to a `Vec`) of its own.
        assert_eq!(IntoBytes::into_bytes(String::from("ok")), want);
        assert_eq!(b"ok".to_vec().into_bytes(), want);
        assert_eq!(Box::<[u8]>::from(&b"ok"[..]).into_bytes(), want);
        assert_eq!(bytes::BytesMut::from(&b"ok"[..]).into_bytes(), want);
        assert_eq!(want.clone().into_bytes(), want);
    }

    #[test]
    fn owned_buffers_are_not_copied() {
        let v = b"a result".to_vec();
        let at = v.as_ptr();
        assert_eq!(v.into_bytes().as_ptr(), at);
        let m = bytes::BytesMut::from(&b"a result"[..]);
        let at = m.as_ptr();
        assert_eq!(m.into_bytes().as_ptr(), at);
    }
}
