//! The span a guarded request's claim and execution run in: the request's `tracing` span
//! (feature `tracing`), or [`NoSpan`] without it, so the code that enters one is written
//! once.
//!
//! Invariant: without the `tracing` feature nothing here costs anything at run time.

use std::future::Future;

/// `future`, run inside the request's span (feature `tracing`: see [`Asked::span`]).
#[cfg(feature = "tracing")]
pub(crate) fn in_span<F: Future>(
    span: tracing::Span,
    future: F,
) -> impl Future<Output = F::Output> {
    tracing::Instrument::instrument(future, span)
}

/// `future` (without the `tracing` feature there is no span).
#[cfg(not(feature = "tracing"))]
pub(crate) fn in_span<F: Future>(_span: NoSpan, future: F) -> F {
    future
}

/// What stands for a span without the `tracing` feature: nothing.
#[cfg(not(feature = "tracing"))]
#[derive(Clone, Copy)]
pub(crate) struct NoSpan;

/// The span this code runs in: the request's, entered by [`in_span`].
#[cfg(feature = "tracing")]
pub(crate) fn current_span() -> tracing::Span {
    tracing::Span::current()
}

/// No span without the `tracing` feature.
#[cfg(not(feature = "tracing"))]
pub(crate) fn current_span() -> NoSpan {
    NoSpan
}
