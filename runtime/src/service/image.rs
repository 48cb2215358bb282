//! Image RPCs: `PullImage`, `ListImages`, `StreamImages`, `ImageStatus`, `RemoveImage`,
//! `ImageFsInfo`. Thin: pulling, records and usage are the `crius-image` crate's.

use std::collections::HashMap;
use std::sync::Arc;

use crius_api::v1::*;
use crius_image::ImageRecord;

use super::BoxStream;
use crate::daemon::Daemon;
use crate::error::{Error, Result};
use crate::util::{excerpt, now_nanos};

fn image_name(spec: Option<&ImageSpec>, field: &str) -> Result<String> {
    match spec.map(|s| s.image.trim()) {
        Some(name) if !name.is_empty() => Ok(name.to_string()),
        _ => Err(Error::InvalidArgument(format!("{field}.image is required"))),
    }
}

fn cri_image(d: &Daemon, r: &ImageRecord) -> Image {
    Image {
        id: r.id.clone(),
        repo_tags: r.repo_tags.clone(),
        repo_digests: r.repo_digests.clone(),
        size: r.size,
        uid: r.uid.map(|value| Int64Value { value }),
        username: r.username.clone(),
        spec: Some(ImageSpec {
            image: r.id.clone(),
            ..Default::default()
        }),
        pinned: r.pinned || d.pinned_by(r).is_some(),
    }
}

/// Credentials end up in HTTP headers and token requests, where a NUL, CR or LF would cut or
/// split a header: refused before any connection. Secrets are named, never quoted.
fn check_auth(a: &AuthConfig) -> Result<()> {
    let fields = [
        ("username", &a.username, true),
        ("password", &a.password, false),
        ("auth", &a.auth, false),
        ("server_address", &a.server_address, true),
        ("identity_token", &a.identity_token, false),
        ("registry_token", &a.registry_token, false),
    ];
    for (field, value, quote) in fields {
        let Some(at) = value.find(['\0', '\r', '\n']) else {
            continue;
        };
        let what = match value.as_bytes()[at] {
            0 => "a NUL byte",
            b'\r' => "a carriage return",
            _ => "a newline",
        };
        let shown = if quote {
            format!(" {:?}", excerpt(value))
        } else {
            String::new()
        };
        return Err(Error::InvalidArgument(format!(
            "auth.{field}{shown} contains {what} (at byte {at})"
        )));
    }
    Ok(())
}

pub async fn pull(d: &Arc<Daemon>, req: PullImageRequest) -> Result<PullImageResponse> {
    let name = image_name(req.image.as_ref(), "image")?;
    if let Some(auth) = &req.auth {
        check_auth(auth)?;
    }
    let auth = req
        .auth
        .map(|a| crius_image::Auth {
            username: a.username,
            password: a.password,
            auth: a.auth,
            server_address: a.server_address,
            identity_token: a.identity_token,
            registry_token: a.registry_token,
        })
        .unwrap_or_default();
    let started = std::time::Instant::now();
    let pulled = d
        .images
        .pull_with(&name, &auth, crius_image::PullOptions::default())
        .await;
    let metrics = crate::telemetry::metrics();
    let record = match pulled {
        Ok((Some(record), report)) => {
            metrics.image_pull(true, report.fetched_bytes, report.total_time);
            record
        }
        Ok((None, _)) => {
            metrics.image_pull(false, 0, started.elapsed());
            return Err(Error::internal(format!("pull {name}"), "no image recorded"));
        }
        Err(e) => {
            metrics.image_pull(false, 0, started.elapsed());
            return Err(e.into());
        }
    };
    Ok(PullImageResponse {
        image_ref: record.id,
    })
}

fn list_items(d: &Daemon, filter: Option<ImageFilter>) -> Result<Vec<Image>> {
    let name = filter
        .and_then(|f| f.image)
        .map(|s| s.image)
        .filter(|s| !s.is_empty());
    Ok(d.images
        .list(name.as_deref())?
        .iter()
        .map(|r| cri_image(d, r))
        .collect())
}

pub async fn list(d: &Arc<Daemon>, req: ListImagesRequest) -> Result<ListImagesResponse> {
    Ok(ListImagesResponse {
        images: list_items(d, req.filter)?,
    })
}

pub async fn stream(
    d: &Arc<Daemon>,
    req: StreamImagesRequest,
) -> Result<BoxStream<StreamImagesResponse>> {
    let images = list_items(d, req.filter)?;
    Ok(super::in_chunks(images, |images| StreamImagesResponse {
        images,
    }))
}

/// An unknown image is an empty response, not an error: kubelet asks before every pull. With
/// `verbose`, a pull of the image under way is in `info["pull"]` (bytes, and each blob's bytes
/// and stall time), whether or not an earlier pull left the image here.
pub async fn status(d: &Arc<Daemon>, req: ImageStatusRequest) -> Result<ImageStatusResponse> {
    let name = image_name(req.image.as_ref(), "image")?;
    let mut info = HashMap::new();
    if req.verbose {
        if let Some(pull) = pull_under_way(d, &name) {
            info.insert("pull".to_string(), pull);
        }
    }
    let Some(record) = d.images.get(&name)? else {
        return Ok(ImageStatusResponse { image: None, info });
    };
    if req.verbose {
        let config = d.images.config_json(&record)?;
        let config: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
        info.insert(
            "info".to_string(),
            serde_json::json!({
                "imageSpec": config,
                "chainID": record.chain_ids.last().map(|c| c.to_string()),
                "manifestDigest": record.manifest_digest.to_string(),
            })
            .to_string(),
        );
    }
    Ok(ImageStatusResponse {
        image: Some(cri_image(d, &record)),
        info,
    })
}

/// The progress of a pull of `name` (any reference form) under way, as JSON.
fn pull_under_way(d: &Daemon, name: &str) -> Option<String> {
    let wanted = crius_image::Reference::parse(name).ok()?.to_string();
    let pull = d
        .images
        .pulls_in_progress()
        .into_iter()
        .find(|p| p.image == wanted)?;
    let blobs: Vec<serde_json::Value> = pull
        .blobs
        .iter()
        .map(|b| {
            serde_json::json!({
                "digest": b.digest,
                "doneBytes": b.done_bytes,
                "totalBytes": b.total_bytes,
                "stalledSeconds": b.stalled.as_secs_f64(),
            })
        })
        .collect();
    Some(
        serde_json::json!({
            "doneBytes": pull.done_bytes,
            "totalBytes": pull.total_bytes,
            "elapsedSeconds": pull.elapsed.as_secs_f64(),
            "blobs": blobs,
        })
        .to_string(),
    )
}

/// Removing an unknown image is success (idempotent, as kubelet's image GC expects).
pub async fn remove(d: &Arc<Daemon>, req: RemoveImageRequest) -> Result<RemoveImageResponse> {
    let name = image_name(req.image.as_ref(), "image")?;
    if let Some(pattern) = d.images.get(&name)?.and_then(|r| d.pinned_by(&r)) {
        return Err(Error::FailedPrecondition(format!(
            "image {:?} is pinned by [images] pinned {pattern:?}: take it out of the \
             configuration (then SIGHUP) to remove the image",
            excerpt(&name)
        )));
    }
    d.images.remove(&name).await?;
    Ok(RemoveImageResponse {})
}

pub async fn fs_info(d: &Arc<Daemon>, _req: ImageFsInfoRequest) -> Result<ImageFsInfoResponse> {
    let usage = d.images.fs_usage().await?;
    // The containers' writable layers: the sum of their upper directories. They live on the
    // image store's filesystem (both under the root), which the shared mountpoint tells
    // kubelet, so it does not take them for a separate disk.
    let uppers: Vec<std::path::PathBuf> = d
        .containers
        .all()
        .iter()
        .map(|c| {
            crate::layout::ContainerPaths::new(&d.config.root, &d.config.state, &c.id)
                .layer
                .join("upper")
        })
        .collect();
    let (layer_bytes, layer_inodes) = tokio::task::spawn_blocking(move || {
        uppers
            .iter()
            .filter_map(|u| super::stats::disk_usage(u))
            .fold((0u64, 0u64), |(b, i), (bb, ii)| (b + bb, i + ii))
    })
    .await
    .map_err(|e| Error::internal("sum the writable layers", e))?;
    let fs = |used: u64, inodes: u64| FilesystemUsage {
        timestamp: now_nanos(),
        fs_id: Some(FilesystemIdentifier {
            mountpoint: usage.mountpoint.display().to_string(),
        }),
        used_bytes: Some(UInt64Value { value: used }),
        inodes_used: Some(UInt64Value { value: inodes }),
    };
    Ok(ImageFsInfoResponse {
        image_filesystems: vec![fs(usage.used_bytes, usage.inodes_used)],
        container_filesystems: vec![fs(layer_bytes, layer_inodes)],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_with_line_breaks_or_nul_are_refused_and_secrets_not_quoted() {
        assert!(check_auth(&AuthConfig {
            username: "user".into(),
            password: "p a:s\ts".into(),
            ..Default::default()
        })
        .is_ok());
        let err = check_auth(&AuthConfig {
            password: "hunter2\r\nX-Injected: 1".into(),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("auth.password"), "{err}");
        assert!(err.contains("carriage return"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = check_auth(&AuthConfig {
            username: format!("{}\0", "u".repeat(1 << 20)),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("auth.username") && err.contains("NUL"),
            "{err}"
        );
        assert!(err.len() < 300, "{} bytes", err.len());
    }
}
