//! [`GrpcOutcome`]: what a gRPC call's caller must know, read from tonic's result when
//! the call went through [`IdempotentRetryLayer`](crate::IdempotentRetryLayer).
//!
//! Invariant: as `CallOutcome`'s. `NotSent` only when the call's `Status`
//! holds the service's [`CallFailed`] saying no attempt can have reached the server;
//! `Refused` only for a status the server keeps because the request is wrong whatever
//! the state (the key reused with another request among them), never for the layer's
//! `FAILED_PRECONDITION` saying the key's execution may have run; every other failure
//! is `Unknown`.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use idemcache::layer::{GrpcCode, IDEMPOTENT_REPLAYED};
use tonic::{Code, Status};

use crate::attempt::{self, IDEMPOTENCY_REFUSAL};
use crate::tower::ResendableBody;
use crate::CallFailed;

impl ResendableBody for tonic::body::Body {
    fn from_bytes(bytes: Bytes) -> Self {
        tonic::body::Body::new(Full::new(bytes))
    }
}

/// The `Status` a gRPC call with no answer ends with: the code tonic gives the last
/// failure (`UNAVAILABLE` when nothing was sent; `INVALID_ARGUMENT` when the call was
/// refused before its first attempt), the `CallFailed` as its source.
pub(crate) fn status_of(failed: CallFailed) -> Status {
    let CallFailed { attempts, sent, key, source } = failed;
    let last = Status::from_error(source);
    let code = match (attempts, sent) {
        (0, _) => Code::InvalidArgument,
        (_, false) => Code::Unavailable,
        (_, true) => last.code(),
    };
    let message = last.message().to_owned();
    let failed = CallFailed { attempts, sent, key, source: Box::new(last) };
    let mut status = Status::new(code, format!("{failed}: {message}"));
    status.set_source(Arc::new(failed));
    status
}

/// What became of a gRPC call made through
/// [`IdempotentRetryLayer`](crate::IdempotentRetryLayer): the four answers of
/// `CallOutcome`, over tonic's `Result<tonic::Response<T>, tonic::Status>`.
///
/// ```
/// use idemcache_client::GrpcOutcome;
///
/// let answer: Result<tonic::Response<u32>, tonic::Status> = Err(tonic::Status::invalid_argument("qty"));
/// assert!(matches!(GrpcOutcome::of(answer), GrpcOutcome::Refused { .. }));
/// ```
#[derive(Debug)]
#[must_use = "an outcome says whether the call ran; Unknown must be reconciled"]
pub enum GrpcOutcome<T> {
    /// The server executed the call (`OK`): by this attempt, or by an earlier one whose
    /// answer it replayed.
    Executed {
        /// The answer.
        response: tonic::Response<T>,
        /// Whether it is a replay of an earlier attempt's answer (the server's
        /// `idempotent-replayed: true` metadata).
        replayed: bool,
    },
    /// The server refused the call, and nothing ran: a status that says the request is
    /// wrong whatever the state (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
    /// `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `PERMISSION_DENIED`, `UNAUTHENTICATED`,
    /// `UNIMPLEMENTED`); the key reused with another request is `FAILED_PRECONDITION`
    /// with `idempotency-refusal: idempotency_key_reused`. Retrying will not help.
    Refused {
        /// The server's status, its metadata included.
        status: Status,
    },
    /// No attempt reached the server: nothing ran. Give up, or call again later (with
    /// the same key).
    NotSent {
        /// The call's status (`UNAVAILABLE`), holding the service's [`CallFailed`]
        /// ([`CallFailed::find`] on it: the attempts made, the key).
        status: Status,
    },
    /// The call was sent and got no final answer within the policy's deadline, or the
    /// key's execution may have run (`FAILED_PRECONDITION` with `idempotency-refusal:
    /// outcome_unknown` or `response_not_kept`): mark your own claim UNKNOWN and settle
    /// it by the same key.
    Unknown {
        /// The last status: the server's, or the call's holding the [`CallFailed`].
        status: Status,
    },
}

impl<T> GrpcOutcome<T> {
    /// The outcome of `result`, what a unary call through the layer returned.
    pub fn of(result: Result<tonic::Response<T>, Status>) -> GrpcOutcome<T> {
        let status = match result {
            Ok(response) => {
                let replayed = response
                    .metadata()
                    .get(IDEMPOTENT_REPLAYED)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                return GrpcOutcome::Executed { response, replayed };
            }
            Err(status) => status,
        };
        if let Some(failed) = CallFailed::find(&status) {
            return if failed.sent {
                GrpcOutcome::Unknown { status }
            } else {
                GrpcOutcome::NotSent { status }
            };
        }
        let refusal = status.metadata().get(IDEMPOTENCY_REFUSAL).and_then(|v| v.to_str().ok());
        let code = GrpcCode::from_u32(status.code() as i32 as u32);
        if code.is_some_and(|code| attempt::grpc_refused(code, refusal)) {
            GrpcOutcome::Refused { status }
        } else {
            GrpcOutcome::Unknown { status }
        }
    }

    /// Whether the call ran (`Some(true)`), did not (`Some(false)`), or may have
    /// (`None`: reconcile it).
    pub fn ran(&self) -> Option<bool> {
        match self {
            GrpcOutcome::Executed { .. } => Some(true),
            GrpcOutcome::Refused { .. } | GrpcOutcome::NotSent { .. } => Some(false),
            GrpcOutcome::Unknown { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CallKey;

    fn with_refusal(code: Code, refusal: &'static str) -> Status {
        let mut status = Status::new(code, "refused");
        status.metadata_mut().insert("idempotency-refusal", refusal.parse().unwrap());
        status
    }

    #[test]
    fn a_reused_key_is_refused_and_an_unknown_outcome_is_unknown() {
        let outcome = |s: Status| GrpcOutcome::<()>::of(Err(s)).ran();
        let reused = with_refusal(Code::FailedPrecondition, "idempotency_key_reused");
        assert_eq!(outcome(reused), Some(false));
        assert_eq!(outcome(with_refusal(Code::FailedPrecondition, "outcome_unknown")), None);
        assert_eq!(outcome(with_refusal(Code::FailedPrecondition, "response_not_kept")), None);
        assert_eq!(outcome(Status::invalid_argument("qty")), Some(false));
        assert_eq!(outcome(Status::unavailable("down")), None, "a server's last UNAVAILABLE");
        assert_eq!(outcome(Status::aborted("running")), None);
    }

    #[test]
    fn a_replay_is_read_from_the_metadata() {
        let mut response = tonic::Response::new(7);
        response.metadata_mut().insert("idempotent-replayed", "true".parse().unwrap());
        match GrpcOutcome::of(Ok(response)) {
            GrpcOutcome::Executed { response, replayed } => {
                assert!(replayed);
                assert_eq!(response.into_inner(), 7);
            }
            other => panic!("expected Executed, got {other:?}"),
        }
        let fresh = GrpcOutcome::of(Ok(tonic::Response::new(())));
        assert!(matches!(fresh, GrpcOutcome::Executed { replayed: false, .. }));
    }

    #[test]
    fn a_failed_call_is_a_status_holding_it_and_says_whether_it_was_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let key = Some(CallKey::new("k-2").unwrap());
        let never = CallFailed { attempts: 3, sent: false, key, source: Box::new(refused) };
        let status = status_of(never);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with("the call (k-2) was never sent, after 3 attempts"));
        let found = CallFailed::find(&status).expect("the CallFailed");
        assert_eq!((found.attempts, found.sent), (3, false));
        assert!(matches!(GrpcOutcome::<()>::of(Err(status)), GrpcOutcome::NotSent { .. }));
        let lost = CallFailed { attempts: 2, sent: true, key: None, source: "reset".into() };
        assert!(matches!(GrpcOutcome::<()>::of(Err(status_of(lost))), GrpcOutcome::Unknown { .. }));
        let before = status_of(CallFailed::before_sending("a bad key".into()));
        assert_eq!(before.code(), Code::InvalidArgument);
        assert!(matches!(GrpcOutcome::<()>::of(Err(before)), GrpcOutcome::NotSent { .. }));
    }
}
