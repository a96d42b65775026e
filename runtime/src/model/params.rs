//! The parameters of a module by their record field path (`layers.0.self_attn.q_proj.weight`).
//! The converter fills a freshly built model through these paths and the runtime checks a
//! loaded record's shapes against a freshly built one, so both read one source of truth: the
//! module definition in `llama.rs`.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// One float parameter of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Record field path, `layers.0.self_attn.q_proj.weight`.
    pub path: String,
    pub shape: Vec<usize>,
    /// The Burn module type it is a field of (`Linear`, `RmsNorm`, `Embedding`), which says
    /// how it is laid out (a `Linear` weight is `[d_in, d_out]`, PyTorch's transposed).
    pub owner: String,
    /// Bytes per element in memory: the dtype's once loaded (2 for a bf16 matrix), 4 for a
    /// parameter not yet allocated.
    pub element_bytes: usize,
}

/// Where a module visitor or mapper is in the module tree: the field names entered so far,
/// each with the Burn module type it is a field of. What the converter's and the loader's
/// mappers and [`params`] all track to name a parameter.
#[derive(Debug, Default)]
pub struct FieldPath(Vec<(String, String)>);

impl FieldPath {
    /// Entering field `name` of a module of `container_type` (Burn's `Struct:Linear`,
    /// `Vec`, ...).
    pub fn enter(&mut self, name: &str, container_type: &str) {
        let owner = container_type.rsplit(':').next().unwrap_or(container_type);
        self.0.push((name.to_string(), owner.to_string()));
    }

    pub fn exit(&mut self) {
        self.0.pop();
    }

    /// Record field path of where we are, `layers.0.self_attn.q_proj.weight`.
    pub fn path(&self) -> String {
        let names: Vec<&str> = self.0.iter().map(|(name, _)| name.as_str()).collect();
        names.join(".")
    }

    /// The module type the innermost field belongs to (`Linear`, `RmsNorm`, ...).
    pub fn owner(&self) -> &str {
        self.0.last().map_or("", |(_, owner)| owner.as_str())
    }
}

/// Every float parameter of `module`, in visiting order. Reads shapes without initialising
/// lazy parameters.
pub fn params<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamInfo> {
    let mut visitor = ParamVisitor {
        path: FieldPath::default(),
        found: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.found
}

struct ParamVisitor {
    path: FieldPath,
    found: Vec<ParamInfo>,
}

impl<B: Backend> ModuleVisitor<B> for ParamVisitor {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.exit();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let element_bytes = if param.is_initialized() {
            param.val().dtype().size()
        } else {
            size_of::<f32>()
        };
        self.found.push(ParamInfo {
            path: self.path.path(),
            shape: param.lazy_shape().to_vec(),
            owner: self.path.owner().to_string(),
            element_bytes,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FlexBackend;
    use crate::model::config::{Biases, LlamaConfig};

    #[test]
    fn names_each_parameter_with_its_owner() {
        let config = LlamaConfig {
            biases: Biases {
                qkv: true,
                o: false,
                mlp: true,
            },
            ..LlamaConfig::plain([8, 16, 2], [2, 1, 4], 10, 16)
        };
        let found = params::<FlexBackend, _>(&config.init(&Default::default()));
        let find = |path: &str| found.iter().find(|p| p.path == path).expect(path).clone();
        let q = find("layers.1.self_attn.q_proj.weight");
        assert_eq!((q.shape, q.owner.as_str()), (vec![8, 8], "Linear"));
        assert_eq!(find("layers.0.input_layernorm.gamma").owner, "RmsNorm");
        assert_eq!(find("embed_tokens.weight").owner, "Embedding");
        assert_eq!(find("lm_head.weight").shape, vec![8, 10]);
        assert_eq!(find("layers.0.self_attn.k_proj.bias").shape, vec![4]);
        assert!(
            found
                .iter()
                .all(|p| p.path != "layers.0.self_attn.o_proj.bias")
        );
        assert_eq!(find("layers.1.mlp.down_proj.bias").owner, "Linear");
        // Per layer 9 weights, q/k/v and gate/up/down biases.
        assert_eq!(found.len(), 3 + 2 * (9 + 6));
        let total: usize = found
            .iter()
            .map(|p| p.shape.iter().product::<usize>())
            .sum();
        assert_eq!(config.parameter_count(), total as u128);
    }
}
