//! [`CallFailed`]: how a call with no answer ended, for the reqwest middleware and the
//! tower service alike.
//!
//! Invariant: `sent` is `false` only when no attempt can have reached the server (no
//! connection was ever made, or the call was refused before its first attempt).

// Without a client form (neither `reqwest` nor `tower`), nothing chooses a key.
#![cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]

use std::fmt;

use http::HeaderValue;

use crate::CallKey;

/// The error a call ends with when it has no answer: the last attempt's failure, the
/// number of attempts, and whether any may have reached the server.
#[derive(Debug)]
pub struct CallFailed {
    /// The attempts made (0 when the call was refused before its first).
    pub attempts: u32,
    /// Whether any attempt may have reached the server: `false` means no connection
    /// was ever made (nothing can have run).
    pub sent: bool,
    /// The call's key, if one was chosen.
    pub key: Option<CallKey>,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync>,
}

impl CallFailed {
    /// The `CallFailed` inside `error`, if the middleware ended the call with one (a
    /// `reqwest_middleware::Error::Middleware` holding it).
    #[cfg(feature = "reqwest")]
    pub fn of(error: &reqwest_middleware::Error) -> Option<&CallFailed> {
        match error {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<CallFailed>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// The `CallFailed` that is `error` or one of its causes (its
    /// [`source`](std::error::Error::source) chain): the tower service's error, or the
    /// `tonic::Status` a gRPC call through it ended with.
    pub fn find<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e CallFailed> {
        crate::attempt::causes(error).find_map(|e| e.downcast_ref::<CallFailed>())
    }

    /// A call refused before its first attempt: nothing was sent.
    pub(crate) fn before_sending(why: String) -> CallFailed {
        CallFailed { attempts: 0, sent: false, key: None, source: why.into() }
    }
}

/// Says what the call came to; the last attempt's failure is its
/// [`source`](std::error::Error::source), not repeated here.
impl fmt::Display for CallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self.key.as_ref().map_or("no key", CallKey::as_str);
        let sent = if self.sent { "may have reached the server" } else { "was never sent" };
        let plural = if self.attempts == 1 { "" } else { "s" };
        write!(f, "the call ({key}) {sent}, after {} attempt{plural}", self.attempts)
    }
}

impl std::error::Error for CallFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The key of a call: the caller's [`CallKey`] (from the request's extensions), else
/// the `Idempotency-Key` header it set (checked), else a new one.
pub(crate) fn key_for(
    chosen: Option<&CallKey>,
    header: Option<&HeaderValue>,
) -> Result<CallKey, CallFailed> {
    if let Some(key) = chosen {
        return Ok(key.clone());
    }
    let Some(set) = header else { return Ok(CallKey::generate()) };
    let refused = |why: String| {
        CallFailed::before_sending(format!("the request's Idempotency-Key header {why}"))
    };
    let text = set.to_str().map_err(|_| refused("is not visible ASCII".into()))?;
    CallKey::new(text).map_err(|e| refused(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_says_whether_it_was_sent_and_keeps_its_cause() {
        use std::error::Error as _;
        let failed = CallFailed {
            attempts: 3,
            sent: false,
            key: Some(CallKey::new("k-1").unwrap()),
            source: "connection refused".into(),
        };
        let said = failed.to_string();
        assert_eq!(said, "the call (k-1) was never sent, after 3 attempts");
        assert_eq!(failed.source().unwrap().to_string(), "connection refused");
        let sent = CallFailed { sent: true, key: None, ..failed };
        assert!(sent.to_string().starts_with("the call (no key) may have reached the server"));
        let wrapped = std::io::Error::other(sent);
        assert_eq!(CallFailed::find(&wrapped).map(|f| f.attempts), Some(3), "found as a cause");
        assert!(CallFailed::find(&std::io::Error::other("other")).is_none());
        let once = CallFailed { attempts: 1, sent: true, key: None, source: "timeout".into() };
        assert_eq!(
            once.to_string(),
            "the call (no key) may have reached the server, after 1 attempt"
        );
    }

    #[test]
    fn the_key_is_the_callers_else_the_header_else_a_new_one() {
        let chosen = CallKey::new("chosen").unwrap();
        let header = HeaderValue::from_static("from-header");
        assert_eq!(key_for(Some(&chosen), Some(&header)).unwrap(), chosen);
        assert_eq!(key_for(None, Some(&header)).unwrap().as_str(), "from-header");
        assert_eq!(key_for(None, None).unwrap().as_str().len(), 36);
        let long = HeaderValue::from_str(&"k".repeat(300)).unwrap();
        let refused = key_for(None, Some(&long)).unwrap_err();
        assert_eq!((refused.attempts, refused.sent), (0, false));
    }
}
