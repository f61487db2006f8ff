"""Offline batch generation with LLM: a fixed list in, a list out, in input order."""

from reference_engine import LLM, SamplingParams


def main(model: str = "fixtures/models/tiny-llama"):
    llm = LLM(model=model, max_num_seqs=64)
    params = SamplingParams(temperature=0, max_tokens=16)
    outputs = llm.generate(["Hello, my name is", {"prompt_token_ids": [0, 11, 12]}], params)
    for out in outputs:
        print(repr(out.outputs[0].text), out.outputs[0].finish_reason)
    print(llm.get_kv_cache_stats())
    return outputs


if __name__ == "__main__":
    main()
