"""The default prompts of the LLM-backed steps (captioning, benchmark writing, judging): config values a run may
override, kept here so the schemas stay readable."""

CAPTION_SYSTEM_PROMPT = "You annotate anime clips for a training dataset. Follow the requested output format exactly."
CAPTION_CHARACTERS_PROMPT = (
    "The first {num_references} images are reference pictures of known characters ({reference_list}). "
    "The next {num_frames} images are frames sampled in time order from one anime clip. "
    "Which of the known characters appear in the clip? Answer with one line of the form <C>name, name</C> "
    "using only these names: {names}; or <C>none</C> if none of them appears."
)
CAPTION_DESCRIBE_PROMPT = (
    "These {num_frames} images are frames sampled in time order from one anime clip. "
    "Known characters in the clip: {characters}. "
    "Its measured motion level is {motion_level} on a scale from 1 (nearly still) to {num_levels} (very fast).\n"
    "Describe the clip in exactly one line with these tags, in this order, and nothing else:\n"
    "<S>the main character: a name from the known characters if one appears, else a short noun such as Girl</S>"
    "<MD>what the character does, a short verb phrase</MD>"
    "<EV>the environment or background, a short noun phrase</EV>"
    "<MA>one adverb for how the motion is performed, in keeping with the motion level</MA>"
    "<SC>1 if the character interacts with another character, else 0</SC>"
    "<ET>1 if the character is doing something for fun or leisure, else 0</ET>"
    "<ST>-1 if the activity tires the character, 1 if it restores stamina (resting, eating, sleeping), else 0</ST>\n"
    "Example: <S>Girl</S><MD>run</MD><EV>Forest</EV><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"
)
CAPTION_RETRY_PROMPT = "That answer is not valid: {error}. Answer again with exactly one line in the required format."

BENCHMARK_SYSTEM_PROMPT = "You write stories for an anime life-simulation game. You answer with tag lines only."

BENCHMARK_PROMPT = """Write story {number} of a life-simulation game for the anime character {character}: \
{turns} turns, each one short animation shot of {character}'s daily life. Consecutive turns continue one coherent \
day (places and activities follow from each other), with a mix of calm and energetic moments.

Answer with exactly {turns} lines, one per turn, and nothing else. Each line holds exactly these tags in this order:
<S>character</S><MD>motion</MD><EV>environment</EV><ML>motion level</ML><MA>manner</MA><SC>social</SC>\
<ET>entertainment</ET><ST>stamina</ST>
- S: always {character}
- MD: what {character} does, a short verb phrase without semicolons
- EV: where and when, a short phrase without semicolons
- ML: how much motion the shot shows, 1 (almost still) to 5 (fast, large movement)
- MA: how the motion is done, one adverb (may be empty)
- SC: 1 if {character} interacts with someone, else 0
- ET: 1 if it is a leisure or fun activity, else 0
- ST: -1 if the activity is tiring, 1 if it is restful or restoring (sleeping, eating), else 0

Example line:
<S>{character}</S><MD>run along the river</MD><EV>park at sunset</EV><ML>4</ML><MA>happily</MA><SC>0</SC>\
<ET>1</ET><ST>-1</ST>"""

BENCHMARK_RETRY_PROMPT = """Your answer was rejected: {error}
Answer again with exactly {turns} tag lines for {character} and nothing else."""

JUDGE_SYSTEM_PROMPT = "You are a strict, consistent evaluator of an anime life-simulation game."

JUDGE_PROMPT = """A player gave the anime character {character} one instruction per turn, and the game answered each \
with a short animation. {references}You see {frames_per_turn} frames of each turn's animation, in order:

{instructions}

Rate the whole game from 1 (very poor) to 10 (excellent) on:
- overall: overall quality as an animated life simulation
- instruction_following: each animation shows what its instruction asks (action and background)
- contextual_coherence: consecutive animations fit together as one continuing story
- character_consistency: the character keeps the same look, as {character}, in every turn

Answer with only a JSON object holding the four integer scores, for example:
{"overall": 6, "instruction_following": 7, "contextual_coherence": 5, "character_consistency": 8}"""

JUDGE_RETRY_PROMPT = "Your previous answer was rejected: {error}. Answer with only the JSON object of four scores."
