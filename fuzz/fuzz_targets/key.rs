//! Arbitrary bytes into every key and fingerprint constructor (a client key as text and
//! as bytes): a typed error or a value, never a panic; and a key's stored form always
//! gives back exactly the parts it was built from, so two different part-tuples can
//! never share one stored form.
#![no_main]

use arbitrary::Unstructured;
use idemcache::{Fingerprint, Key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Raw bytes as a stored form: parse, and if accepted, it must re-encode to itself.
    if let Ok(key) = Key::from_bytes(data) {
        assert_eq!(key.as_bytes(), data);
        let rebuilt = match key.tenant() {
            Some(t) => Key::new(key.scope(), t, key.client_key()),
            None => Key::without_tenant(key.scope(), key.client_key()),
        };
        assert_eq!(rebuilt.as_ref(), Ok(&key));
    }

    // Arbitrary parts through the constructors.
    let mut u = Unstructured::new(data);
    let (Ok(scope), Ok(tenant), Ok(client)) =
        (u.arbitrary::<&str>(), u.arbitrary::<Option<&str>>(), u.arbitrary::<&str>())
    else {
        return;
    };
    let built = match tenant {
        Some(t) => Key::new(scope, t, client),
        None => Key::without_tenant(scope, client),
    };
    if let Ok(key) = built {
        // Injective: the stored form decodes to exactly these parts.
        assert_eq!((key.scope(), key.tenant(), key.client_key()), (scope, tenant, client));
        assert_eq!(Key::from_bytes(key.as_bytes()).as_ref(), Ok(&key));
    }

    // A client key as bytes (a header's, as they arrived): accepted exactly when they
    // are 1 to 255 bytes of visible ASCII, and read back as the same bytes.
    if let Ok(bytes) = u.arbitrary::<&[u8]>() {
        let visible =
            !bytes.is_empty() && bytes.len() <= 255 && bytes.iter().all(u8::is_ascii_graphic);
        match Key::without_tenant("s", bytes) {
            Ok(key) => {
                assert!(visible, "accepted {bytes:?}");
                assert_eq!(key.client_key().as_bytes(), bytes);
            }
            Err(_) => assert!(!visible, "refused {bytes:?}"),
        }
    }

    // Fingerprints: any input, deterministic, never a panic.
    let rest = u.take_rest();
    assert_eq!(Fingerprint::of(rest), Fingerprint::of(rest));
    let build = || {
        Fingerprint::builder()
            .method(scope)
            .path(client)
            .header(tenant.unwrap_or(""), rest)
            .body(rest)
            .bytes(scope.as_bytes())
            .finish()
    };
    assert_eq!(build(), build());
});
