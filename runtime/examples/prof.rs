use runtime::FlexBackend;
use runtime::generate::Generator;
use std::time::Instant;
fn main() {
    runtime::keep_freed_memory();
    let mode = std::env::args().nth(1).unwrap_or("pp".into());
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(512);
    let reps: usize = std::env::args()
        .nth(3)
        .map(|s| s.parse().unwrap())
        .unwrap_or(5);
    runtime::in_thread_pool(Some(2), || {
        let g = Generator::<FlexBackend>::load(
            "artifacts/smollm2-135m-instruct".as_ref(),
            &Default::default(),
        )
        .unwrap();
        let toks: Vec<u32> = (0..n).map(|i| ((i * 7919) % 40000 + 100) as u32).collect();
        for _ in 0..reps {
            let t = Instant::now();
            if mode == "pp" {
                let mut c = g.new_cache(n);
                g.forward_logits(&toks, &mut c, false).unwrap();
            } else {
                let mut c = g.new_cache(n);
                for i in 0..n {
                    g.forward_logits(&toks[i..i + 1], &mut c, false).unwrap();
                }
            }
            eprintln!(
                "{mode}{n}: {:.1} tok/s",
                n as f64 / t.elapsed().as_secs_f64()
            );
        }
    })
    .unwrap();
}
