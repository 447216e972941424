//! Errors: the Kubernetes `Status` answers the server gives, and [`ClusterError`] for the Rust API.

use serde_json::{Value, json};

/// An error answered to a client as a Kubernetes `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    /// Answered as the plain-text `404 page not found` of the real server's mux, not a `Status`.
    pub(crate) plain: bool,
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
}

/// Group, resource (plural) and name of what an error is about, for `Status.details`.
pub(crate) struct Subject<'a> {
    pub(crate) group: &'a str,
    pub(crate) plural: &'a str,
    pub(crate) name: &'a str,
}

impl Subject<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn details(&self) -> Value {
        let mut d = json!({"name": self.name, "kind": self.plural});
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            plain: false,
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub(crate) fn not_found(s: Subject<'_>) -> ApiError {
        ApiError {
            details: Some(s.details()),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{}\" not found", s.qualified(), s.name),
            )
        }
    }

    /// The plain-text 404 the real server answers for paths no API group serves (unknown groups, and
    /// unknown kinds of custom resource groups).
    pub(crate) fn page_not_found() -> ApiError {
        ApiError {
            plain: true,
            ..ApiError::new(404, "NotFound", "404 page not found")
        }
    }

    pub(crate) fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub(crate) fn already_exists(s: Subject<'_>) -> ApiError {
        ApiError {
            details: Some(s.details()),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{}\" already exists", s.qualified(), s.name),
            )
        }
    }

    pub(crate) fn conflict(s: Subject<'_>) -> ApiError {
        ApiError {
            details: Some(s.details()),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your \
                     changes to the latest version and try again",
                    s.qualified(),
                    s.name
                ),
            )
        }
    }

    pub(crate) fn precondition(s: Subject<'_>, what: String) -> ApiError {
        ApiError {
            details: Some(s.details()),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": {what}",
                    s.qualified(),
                    s.name
                ),
            )
        }
    }

    /// 422 Invalid: `Kind "name" is invalid: field: reason`.
    pub(crate) fn invalid(
        group: &str,
        kind: &str,
        name: &str,
        field: &str,
        reason: String,
    ) -> ApiError {
        let cause = if reason.starts_with("Required value") {
            "FieldValueRequired"
        } else if reason.starts_with("Forbidden") {
            "FieldValueForbidden"
        } else if reason.starts_with("Unsupported value") {
            "FieldValueNotSupported"
        } else {
            "FieldValueInvalid"
        };
        let mut details = json!({"kind": kind, "causes": [{
            "reason": cause, "message": reason.clone(), "field": field}]});
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{qualified} \"{name}\" is invalid: {field}: {reason}"),
            )
        }
    }

    /// 422 from a JSON patch that does not apply (a failed `test`, a missing path), as the real server's
    /// generic 422; the patch error goes in the causes.
    pub(crate) fn unprocessable(cause: impl Into<String>) -> ApiError {
        ApiError {
            details: Some(json!({"causes": [{"message": cause.into()}]})),
            ..ApiError::new(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            )
        }
    }

    /// A bare 500 without reason, as the real server answers some storage errors.
    pub(crate) fn storage(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "", message)
    }

    /// What kube-apiserver answers when the request's priority level has no seat or queue
    /// room for it.
    pub(crate) fn too_many_requests() -> ApiError {
        ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        )
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "Forbidden", message)
    }

    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn unsupported_media_type() -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        let m = message.into();
        ApiError {
            details: Some(json!({"causes": [{"message": m.clone()}]})),
            ..ApiError::new(
                500,
                "InternalError",
                format!("Internal error occurred: {m}"),
            )
        }
    }

    pub(crate) fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// The `Status` object.
    pub(crate) fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// Errors of the [`ApiServer`](super::ApiServer) Rust API (HTTP clients get `Status` objects instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The server refused the request; `code` and `reason` are those of the `Status` it would answer.
    #[error("{reason} ({code}): {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// Kubernetes reason, e.g. `Invalid`.
        reason: String,
        /// Human-readable message.
        message: String,
    },
    /// An object could not be turned into JSON.
    #[error("serializing object: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl From<ApiError> for ClusterError {
    fn from(e: ApiError) -> Self {
        ClusterError::Api {
            code: e.code,
            reason: e.reason.to_string(),
            message: e.message,
        }
    }
}
