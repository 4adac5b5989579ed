"""Running graphs: onnxruntime sessions and their options (`sessions`), where they run (`placement`), the checks shared by the trainers (`validation`), device buffers and guards."""
