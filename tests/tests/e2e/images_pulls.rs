//! `crius images pulls` while a real pull is slow: the registry is reached through a relay on
//! 127.0.0.1 that passes at most about 320 KB/s back, so pulling the busybox image takes a few
//! seconds; the piped view lists the pull and its blobs with their bytes (and ImageStatus
//! verbose the same in `info["pull"]`), and says so once no pull is under way. Network 103.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use crate::common::{wait_for, Env};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Relays connections on a new port to `to`, the answers slowed to 16 KiB per 50 ms.
async fn slow_relay(to: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&to).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    let _ = sw.shutdown().await;
                });
                let mut buf = vec![0u8; 16 << 10];
                loop {
                    match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = cw.shutdown().await;
            });
        }
    });
    port
}

fn pulls(env: &Env) -> String {
    let out = Command::new(crius_tests::binary("crius").unwrap())
        .arg("images")
        .arg("--admin-socket")
        .arg(env.crius.state().join("admin.sock"))
        .arg("pulls")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pull_is_shown_with_its_blobs() {
    let env = Env::new().await;
    assert_eq!(pulls(&env), "no pulls under way\n");
    let relay = slow_relay(env.registry.host_port()).await;
    let image = env
        .image
        .replace(&env.registry.host_port(), &format!("127.0.0.1:{relay}"));
    let pull = tokio::spawn({
        let mut client = env.crius.image();
        let image = image.clone();
        async move {
            client
                .pull_image(crius_api::v1::PullImageRequest {
                    image: Some(crius_api::v1::ImageSpec {
                        image,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
        }
    });
    let layer = &env.pushed.layers[0];
    let shown = wait_for(
        "the layer in the pulls view",
        Duration::from_secs(20),
        || {
            let text = pulls(&env);
            async move {
                let row = text
                    .lines()
                    .find(|l| l.trim_start().starts_with(&layer.digest[..19]))?;
                (!row.contains("0.0 of")).then(|| text.clone())
            }
        },
    )
    .await;
    let first = shown.lines().next().unwrap();
    assert!(first.starts_with(&format!("{image}  ")), "{shown}");
    assert!(first.contains(" MB ("), "{shown}");
    let row = shown
        .lines()
        .find(|l| l.trim_start().starts_with(&layer.digest[..19]))
        .unwrap();
    let total = format!("of {:.1} MB", layer.size as f64 / 1e6);
    assert!(row.contains(&total), "{row}");
    assert!(
        row.ends_with("MB/s") || row.contains("stalled") || row.ends_with("done"),
        "{row}"
    );

    // ImageStatus verbose says the same while the image is not there yet.
    let status = env
        .crius
        .image()
        .image_status(crius_api::v1::ImageStatusRequest {
            image: Some(crius_api::v1::ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    // (The relay keeps the pull going for seconds after its layer's first bytes were seen.)
    let info: serde_json::Value = serde_json::from_str(&status.info["pull"]).unwrap();
    let blob = info["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["digest"] == layer.digest.as_str())
        .unwrap_or_else(|| panic!("{info}"));
    assert_eq!(blob["totalBytes"], layer.size, "{info}");
    assert!(info["doneBytes"].as_u64().unwrap() > 0, "{info}");

    pull.await.unwrap().unwrap();
    assert_eq!(pulls(&env), "no pulls under way\n");
}
