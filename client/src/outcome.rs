//! [`CallOutcome`]: what a call's caller must know, read from the middleware's result.
//!
//! Invariant: `NotSent` only when no attempt can have reached the server (no connection
//! was ever made, or the call was refused before its first attempt); `Refused` only for
//! a 4xx that says nothing ran (not a 409); an answer that is not final (a 5xx, a 409)
//! and every other failure is `Unknown`: the call may have run, and only the provider,
//! asked by the same key, can say.

use bytes::Bytes;
use http::StatusCode;
use idemcache::layer::IDEMPOTENT_REPLAYED;

use crate::attempt::{self, Next};
use crate::CallFailed;

/// What became of a call made through [`IdempotentRetry`](crate::IdempotentRetry).
#[derive(Debug)]
#[must_use = "an outcome says whether the call ran; Unknown must be reconciled"]
pub enum CallOutcome {
    /// The server executed the call (a 2xx or 3xx): by this attempt, or by an earlier one
    /// whose answer it replayed.
    Executed {
        /// The answer (a `reqwest::Response`), its body unread.
        response: reqwest::Response,
        /// Whether it is a replay of an earlier attempt's answer (the server's
        /// `Idempotent-Replayed` header).
        replayed: bool,
    },
    /// The server refused the call, and nothing ran: a 4xx other than 409 (the key
    /// reused with another request is 422). Retrying the same request will not help.
    Refused {
        /// The answer's status.
        status: StatusCode,
        /// Its body, as bytes (a problem details document, from an idemcache server).
        problem: Bytes,
    },
    /// No attempt reached the server: nothing ran. Give up, or call again later (with
    /// the same key, to be safe either way).
    NotSent {
        /// Why: a `reqwest_middleware::Error`, holding the middleware's [`CallFailed`]
        /// (read it with [`CallFailed::of`]: the attempts made, the key).
        error: reqwest_middleware::Error,
    },
    /// The call was sent and got no final answer within the policy's deadline, or a 409
    /// (the key's execution still running, its outcome unknown, or its answer not
    /// kept): it may have run. Mark your own claim UNKNOWN and settle it by the same key
    /// (docs/commit-boundary.md).
    Unknown {
        /// The last answer's status, if the last attempt got one (a 5xx, the in-progress
        /// 409).
        status: Option<StatusCode>,
        /// The last attempt's failure, if it had no answer: a `reqwest_middleware::Error`
        /// holding the middleware's [`CallFailed`] ([`CallFailed::of`]).
        error: Option<reqwest_middleware::Error>,
    },
}

impl CallOutcome {
    /// The outcome of `result`, what a `send` through
    /// [`IdempotentRetry`](crate::IdempotentRetry) returned (a
    /// `Result<reqwest::Response, reqwest_middleware::Error>`); a refusal's body is read
    /// here.
    pub async fn of(result: Result<reqwest::Response, reqwest_middleware::Error>) -> CallOutcome {
        let response = match result {
            Ok(response) => response,
            Err(error) => {
                let sent = match (&error, CallFailed::of(&error)) {
                    (_, Some(failed)) => failed.sent,
                    (reqwest_middleware::Error::Reqwest(e), None) => attempt::of_error(e).1,
                    // Another middleware's failure: nothing says it was not sent.
                    (reqwest_middleware::Error::Middleware(_), None) => true,
                };
                return if sent {
                    CallOutcome::Unknown { status: None, error: Some(error) }
                } else {
                    CallOutcome::NotSent { error }
                };
            }
        };
        let status = response.status();
        if status.is_success() || status.is_redirection() {
            let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
            return CallOutcome::Executed { response, replayed };
        }
        // A 409 is never "nothing ran": the key's first execution is still running, or
        // its outcome is unknown, or it ran and its answer was not kept.
        let not_final = attempt::of_response(status, response.headers()) != Next::Final;
        if not_final || status == StatusCode::CONFLICT {
            return CallOutcome::Unknown { status: Some(status), error: None };
        }
        let problem = response.bytes().await.unwrap_or_default();
        CallOutcome::Refused { status, problem }
    }

    /// Whether the call ran (`Some(true)`), did not (`Some(false)`), or may have
    /// (`None`: reconcile it).
    pub fn ran(&self) -> Option<bool> {
        match self {
            CallOutcome::Executed { .. } => Some(true),
            CallOutcome::Refused { .. } | CallOutcome::NotSent { .. } => Some(false),
            CallOutcome::Unknown { .. } => None,
        }
    }
}
