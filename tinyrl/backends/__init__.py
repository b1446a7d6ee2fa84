"""Alternative model loaders behind `model.backend` (the default, transformers + peft, is tinyrl.model).

Each backend lives in its own module and imports its package lazily: `import tinyrl` never
imports unsloth."""
