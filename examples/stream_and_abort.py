"""Stream one request while aborting another, with the online AsyncLLM."""

import asyncio

from reference_engine import AsyncEngineArgs, AsyncLLM, RequestOutputKind, SamplingParams


async def main(model: str = "fixtures/models/tiny-llama") -> None:
    async with AsyncLLM.from_engine_args(AsyncEngineArgs(model=model)) as engine:
        streamed = SamplingParams(max_tokens=24, output_kind=RequestOutputKind.DELTA)
        endless = SamplingParams(max_tokens=4000, ignore_eos=True)

        async def doomed() -> str:
            async for out in engine.generate("Tell me everything.", endless, request_id="b"):
                last = out
            return last.outputs[0].finish_reason  # "abort"

        task = asyncio.create_task(doomed())
        async for out in engine.generate("Once upon a time", streamed, request_id="a"):
            print(out.outputs[0].text, end="", flush=True)  # a yield may carry several tokens
        await engine.abort("b")  # frees b's KV blocks at the next step
        print(f"\nb finished with: {await task}")
        print(engine.get_kv_cache_stats())  # every block free again


if __name__ == "__main__":
    asyncio.run(main())
