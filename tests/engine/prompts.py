"""A fixed, varied prompt set for the engine's equality tests, and the chat question the
tests whose answer must name Paris ask."""

# Asked bare ("What is the capital of France?"), the model's first token is a near tie
# ("The" vs "L", 0.08 nats apart in float32), which int8 activations may tip into a
# French answer that never ends; asked for one sentence, every mode says Paris and stops.
CAPITAL_QUESTION = "What is the capital of France? Answer in one sentence."

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in 1987, a dragon",
    "List three uses of baking soda:",
    "Translate to French: The cat sits on the mat.",
    "import numpy as np\n\n# compute the mean of each row\n",
    "Q: What is 17 times 23?\nA:",
    "The mitochondria is the powerhouse of",
    "Write a haiku about autumn leaves.",
    "SELECT name, email FROM users WHERE",
    "In a shocking turn of events, scientists discovered",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nGive me a short tip for learning Python.<|im_end|>\n<|im_start|>assistant\n",
    "Dear hiring manager,\n\nI am writing to apply for",
    "The three laws of thermodynamics are",
    "Rust's ownership model means that",
    "1, 2, 3, 5, 8, 13,",
    "Photosynthesis converts sunlight into",
    "Here is a recipe for pancakes:\n1.",
    "The quick brown fox",
    "Explain in one paragraph why the sky is blue, mentioning Rayleigh scattering and the "
    "wavelengths of visible light, and say why sunsets look red and orange instead.",
]
