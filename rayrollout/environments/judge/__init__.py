"""Judge: answers graded by a judge model over the OpenAI Chat Completions protocol."""
