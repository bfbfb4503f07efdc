//! What a storage service URL must look like (https, or http to loopback
//! only; no credentials, query or fragment), and how to show a refused one
//! without its secrets. Pure functions on a parsed URL.

use azure_core::http::Url;

/// `url` without the parts that may hold secrets (user info, query,
/// fragment), for messages about a URL that was refused for having them.
pub(crate) fn without_secrets(url: &Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// What a storage service URL must look like: https (plain http only to a
/// loopback host, i.e. a local emulator), no credentials, no query string
/// and no fragment. Every request carries a SAS signed with the account key
/// or a bearer token, which over plain http anyone on the path could read
/// and replay. Queue and container names are appended to the path, which a
/// query would end up after; and a query here is usually a SAS pasted into
/// the wrong place, where it would be logged as part of the URL. Returns
/// why not.
pub(crate) fn check_service_url(url: &Url) -> Result<(), &'static str> {
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(url) => {}
        "http" => {
            return Err(
                "must be https: plain http is allowed only to a loopback host \
                 (127.0.0.0/8, ::1, localhost: a local emulator), since every request \
                 carries a SAS or bearer token",
            );
        }
        _ => return Err("must be an https URL"),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not contain a user name or password");
    }
    if url.query().is_some() {
        return Err(
            "must not have a query string (a SAS goes into SharedAccessSignature, or the credentials)",
        );
    }
    if url.fragment().is_some() {
        return Err("must not have a fragment");
    }
    Ok(())
}

/// Whether `url`'s host is this machine: 127.0.0.0/8, `::1` or `localhost`.
pub(crate) fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}
