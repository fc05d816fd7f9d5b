//! The orders example's call to the payments service (`ORDERS_PAYMENTS`): each new order
//! is charged before it commits, through `idemcache-client` with the order's own
//! `DownstreamKey`, or (`ORDERS_PAYMENTS_CLIENT=reqwest-retry`, the comparison of the
//! two-service fault run) through `reqwest-retry` without a key.
//!
//! Invariant: with the key, every execution of one order (a retry after a 5xx, a retry
//! after this process was killed, a takeover) charges under the same key, so the
//! payments service pays once per order however many executions and attempts reach it.
//! That is why a charge whose outcome is unknown answers 503 and releases the order's
//! key instead of marking it UNKNOWN: the retry that follows asks again by the same key
//! and gets the first charge's answer. (Where the provider does not keep keys as long
//! as your clients retry, mark the claim UNKNOWN instead: docs/client.md.)

use std::time::Duration;

use axum::http::StatusCode;
use idemcache::layer::Claimed;
use idemcache_client::reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use idemcache_client::{reqwest, CallKey, CallOutcome, IdempotentRetry, RetryPolicy};
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;
use serde_json::json;

/// The payments service and how it is called.
pub struct Payments {
    url: String,
    client: ClientWithMiddleware,
    keyed: bool,
}

impl Payments {
    /// From the environment: `ORDERS_PAYMENTS` (the service's base URL; no charge when
    /// unset), `ORDERS_PAYMENTS_CLIENT` (`idemcache`, the default, or `reqwest-retry`),
    /// `ORDERS_PAYMENTS_TIMEOUT_MS` (each attempt's timeout, default 2000) and
    /// `ORDERS_PAYMENTS_DEADLINE_MS` (no retry starts after it, default 10000).
    pub fn from_env(
        number: impl Fn(&str, u64) -> Result<u64, String>,
    ) -> Result<Option<Payments>, Box<dyn std::error::Error>> {
        let url = match std::env::var("ORDERS_PAYMENTS") {
            Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_owned(),
            _ => return Ok(None),
        };
        let timeout = Duration::from_millis(number("ORDERS_PAYMENTS_TIMEOUT_MS", 2000)?.max(1));
        let deadline = Duration::from_millis(number("ORDERS_PAYMENTS_DEADLINE_MS", 10_000)?.max(1));
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        let (client, keyed) = match std::env::var("ORDERS_PAYMENTS_CLIENT").as_deref() {
            Ok("idemcache") | Err(_) => {
                let policy = RetryPolicy::default().with_deadline(deadline)?;
                (ClientBuilder::new(http).with(IdempotentRetry::new(policy)).build(), true)
            }
            // As its users set it up: transient failures (connection errors, timeouts,
            // 5xx, 429) retried with exponential backoff, the request sent as it was.
            Ok("reqwest-retry") => {
                let policy = ExponentialBackoff::builder()
                    .retry_bounds(Duration::from_millis(100), Duration::from_secs(5))
                    .build_with_total_retry_duration(deadline);
                let retry = RetryTransientMiddleware::new_with_policy(policy);
                (ClientBuilder::new(http).with(retry).build(), false)
            }
            Ok(other) => {
                return Err(format!(
                    "ORDERS_PAYMENTS_CLIENT is idemcache or reqwest-retry, not {other:?}"
                )
                .into())
            }
        };
        Ok(Some(Payments { url, client, keyed }))
    }

    /// Charges `amount` to `account` for the order under `order_key`. `Err` is the status
    /// the order answers with: a 5xx, which releases the order's key (nothing of the
    /// order committed), so the client's retry charges again, under the same key.
    pub async fn charge(
        &self,
        claimed: Option<&Claimed>,
        account: &str,
        order_key: &str,
        amount: i64,
    ) -> Result<(), StatusCode> {
        let body = json!({ "account": account, "amount": amount, "order_key": order_key });
        let call = self
            .client
            .post(format!("{}/payments", self.url))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if !self.keyed {
            return match call.send().await {
                Ok(response) if response.status().is_success() => Ok(()),
                Ok(_) | Err(_) => Err(StatusCode::SERVICE_UNAVAILABLE),
            };
        }
        // Behind the layer there is always a claim; its downstream key is the same in
        // every execution of this order.
        let claimed = claimed.ok_or(StatusCode::INTERNAL_SERVER_ERROR)?;
        let key =
            claimed.downstream_key("charge").map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        match CallOutcome::of(call.with_extension(CallKey::from(&key)).send().await).await {
            CallOutcome::Executed { replayed, .. } => {
                if replayed {
                    // The audit of .ci/two-services counts these: a repeat answered by
                    // the first charge, not charged again.
                    eprintln!("the charge of {order_key} was replayed");
                }
                Ok(())
            }
            // Not charged, and a repeat would not be either: a defect, not a fault.
            CallOutcome::Refused { status, .. } => {
                eprintln!("payments refused the charge of {order_key}: {status}");
                Err(StatusCode::BAD_GATEWAY)
            }
            CallOutcome::NotSent { .. } | CallOutcome::Unknown { .. } => {
                Err(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }
}
