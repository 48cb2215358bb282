//! A minimal blocking HTTP/1.1 client for a registry on the loopback interface.
//!
//! Why not `reqwest` or crius's own client: the fixtures exist to check crius's registry client
//! (its own, on hyper and rustls, in `crius-image`). Pushing and reading back with a separate,
//! deliberately plain client keeps a bug in that stack from cancelling itself out, lets tests
//! send exactly the bytes and media types they mean (Docker schema2, an index naming foreign
//! platforms), and keeps this crate free of a TLS stack and an async runtime in the push path.
//! Plain HTTP to 127.0.0.1 with one request per connection needs little code.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::{Error, Result};

const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// A complete HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code, e.g. 200.
    pub status: u16,
    /// Header names as sent; look them up with [`Response::header`].
    pub headers: Vec<(String, String)>,
    /// The body with any chunked transfer coding removed.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The body as text, for error messages.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a new connection (`Connection: close`) and reads the whole response.
///
/// `url` must be `http://host:port/path[?query]`.
pub(crate) fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response> {
    let fail = |source: std::io::Error| Error::Http {
        method: method.to_owned(),
        url: url.to_owned(),
        source,
    };
    let (authority, path) = split_url(url).map_err(fail)?;

    let mut stream = TcpStream::connect(authority).map_err(fail)?;
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(fail)?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(fail)?;

    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nUser-Agent: crius-tests\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(fail)?;
    stream.write_all(body).map_err(fail)?;
    stream.flush().map_err(fail)?;

    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(fail)?;
    parse_response(&raw, method == "HEAD").map_err(fail)
}

/// `http://127.0.0.1:5000/v2/x?y` → (`127.0.0.1:5000`, `/v2/x?y`).
fn split_url(url: &str) -> std::io::Result<(&str, &str)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid("only http:// URLs are supported"))?;
    Ok(match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    })
}

fn parse_response(raw: &[u8], head_request: bool) -> std::io::Result<Response> {
    let end = find(raw, b"\r\n\r\n").ok_or_else(|| invalid("response without a header end"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| invalid("non-UTF-8 header"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid(&format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };

    let rest = &raw[end + 4..];
    if head_request || status == 204 || status == 304 {
        return Ok(response);
    }
    response.body = if response
        .header("transfer-encoding")
        .is_some_and(|coding| coding.eq_ignore_ascii_case("chunked"))
    {
        dechunk(rest)?
    } else if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().map_err(|_| invalid("bad content-length"))?;
        rest.get(..length)
            .ok_or_else(|| invalid("body shorter than content-length"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(response)
}

fn dechunk(mut rest: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or_else(|| invalid("chunk size without CRLF"))?;
        let size_text =
            std::str::from_utf8(&rest[..line_end]).map_err(|_| invalid("chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| invalid("chunk size not hex"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| invalid("chunk shorter than its size"))?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}";
        let response = parse_response(plain, false).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.body, b"{}");
        assert_eq!(response.header("x-a"), Some("b"));

        let chunked =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let response = parse_response(chunked, false).unwrap();
        assert_eq!(response.status, 404);
        assert_eq!(response.body, b"abcde");
    }

    #[test]
    fn head_responses_have_no_body() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n";
        assert!(parse_response(raw, true).unwrap().body.is_empty());
    }

    #[test]
    fn splits_urls() {
        assert_eq!(
            split_url("http://127.0.0.1:5000/v2/a?b=c").unwrap(),
            ("127.0.0.1:5000", "/v2/a?b=c")
        );
        assert_eq!(split_url("http://h:1").unwrap(), ("h:1", "/"));
        assert!(split_url("https://h/").is_err());
    }
}
