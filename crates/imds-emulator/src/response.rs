//! JSON responses in the shape the real IMDS uses (and the HTML page of a
//! server that is not IMDS).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The content type of every IMDS JSON answer.
pub(crate) const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";

/// A response with `body` (already serialized JSON, or deliberately broken
/// JSON for the malformed fault) and the IMDS content type.
pub(crate) fn json_body(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut response = (status, body.into()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(JSON_CONTENT_TYPE),
    );
    response
}

/// A response with a JSON value.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    json_body(status, value.to_string())
}

/// `{"error": message}`.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json(status, &serde_json::json!({ "error": message.into() }))
}

/// An HTML page, for the faults that imitate something other than IMDS.
pub(crate) fn html(status: StatusCode, page: &'static str) -> Response {
    let mut response = (status, page).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}
