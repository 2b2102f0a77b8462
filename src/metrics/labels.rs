//! The metrics' label sets: `decision` (also the access log's word for what happened), the
//! reasons, states and outcomes, each a small type so that a label value cannot be misspelt.

use prometheus_client::encoding::EncodeLabelSet;

/// What happened to a request, as the `decision` label (and the access log) says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionLabel {
    /// Every enforced limit allowed.
    Allowed,
    /// A limit denied: 429.
    Denied,
    /// The store failed; `on_error` answered (forwarded unlimited, or 503).
    StoreError,
    /// A shadow limit (or any limit, in global shadow mode) would have denied; forwarded.
    ShadowDenied,
    /// The route has no limits.
    Unlimited,
    /// The request is exempt (`exempt:`): forwarded, no limit asked.
    Exempt,
    /// An API key no consumer has, rejected with 401.
    InvalidKey,
    /// No slot under the upstream's learned limit within `queue_timeout`: 503, not forwarded.
    Overloaded,
    /// A banned identity (an operator's ban, or a limit's penalty box): 429, not forwarded.
    Banned,
    /// Answered by the response cache: a fresh hit, or another request's fetch; not forwarded.
    Cached,
    /// Held for its limits (`wait:`) and admitted when they had room: forwarded.
    Delayed,
    /// Told to wait its turn by a waiting room (`waiting_room:`): 503, not forwarded.
    Waiting,
    /// A CORS preflight on a route with `cors`: answered 204 by floodgate, never forwarded,
    /// never spending.
    Preflight,
}

impl DecisionLabel {
    pub const ALL: [DecisionLabel; 13] = [
        DecisionLabel::Allowed,
        DecisionLabel::Denied,
        DecisionLabel::StoreError,
        DecisionLabel::ShadowDenied,
        DecisionLabel::Unlimited,
        DecisionLabel::Exempt,
        DecisionLabel::InvalidKey,
        DecisionLabel::Overloaded,
        DecisionLabel::Banned,
        DecisionLabel::Cached,
        DecisionLabel::Delayed,
        DecisionLabel::Waiting,
        DecisionLabel::Preflight,
    ];

    /// The label named `label` ([`DecisionLabel::as_str`]).
    pub fn from_label(label: &[u8]) -> Option<DecisionLabel> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str().as_bytes() == label)
    }

    /// Whether the limits let the request through (`Some(false)`: a 429), when they decided it:
    /// what `floodgate replay` compares its own decision with.
    pub fn admitted_by_limits(self) -> Option<bool> {
        match self {
            DecisionLabel::Allowed | DecisionLabel::ShadowDenied | DecisionLabel::Delayed => {
                Some(true)
            }
            DecisionLabel::Denied => Some(false),
            DecisionLabel::StoreError
            | DecisionLabel::Unlimited
            | DecisionLabel::Exempt
            | DecisionLabel::InvalidKey
            | DecisionLabel::Overloaded
            | DecisionLabel::Banned
            | DecisionLabel::Cached
            | DecisionLabel::Waiting
            | DecisionLabel::Preflight => None,
        }
    }

    /// The `decision` label's value (and serde's).
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionLabel::Allowed => "allowed",
            DecisionLabel::Denied => "denied",
            DecisionLabel::StoreError => "store_error",
            DecisionLabel::ShadowDenied => "shadow_denied",
            DecisionLabel::Unlimited => "unlimited",
            DecisionLabel::Exempt => "exempt",
            DecisionLabel::InvalidKey => "invalid_key",
            DecisionLabel::Overloaded => "overloaded",
            DecisionLabel::Banned => "banned",
            DecisionLabel::Cached => "cached",
            DecisionLabel::Delayed => "delayed",
            DecisionLabel::Waiting => "waiting",
            DecisionLabel::Preflight => "preflight",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) route: String,
    pub(super) decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabel {
    pub(super) route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StatusLabels {
    pub(super) route: String,
    pub(super) class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabel {
    pub(super) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NameLabel {
    pub(super) name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

/// Why floodgate closed a client connection itself (`floodgate_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// An HTTP/2 connection abandoned streams faster than `http2_max_resets_per_second`.
    Resets,
    /// An HTTP/2 connection had no open stream for `timeouts.idle`.
    Idle,
}

impl CloseReason {
    pub(super) const ALL: [CloseReason; 2] = [CloseReason::Resets, CloseReason::Idle];

    /// The `reason` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Resets => "resets",
            CloseReason::Idle => "idle",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabel {
    pub(super) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServiceLabels {
    pub(super) domain: String,
    pub(super) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CostLabels {
    pub(super) route: String,
    pub(super) limit: String,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RoomLabel {
    pub(super) room: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamLabel {
    pub(super) upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndpointLabels {
    pub(super) route: String,
    pub(super) endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndpointStateLabels {
    pub(super) route: String,
    pub(super) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CacheResultLabels {
    pub(super) route: String,
    pub(super) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CacheReasonLabels {
    pub(super) route: String,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteOutcomeLabels {
    pub(super) route: String,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ActionLabel {
    pub(super) action: String,
}
