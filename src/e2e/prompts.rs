//! Prompt sets written for rigbench (original text, no third-party data): a narrative set and a
//! code set of requests, and a narrative filler passage used to build fixed-length prompts.
//!
//! The sets are small on purpose: they exercise realistic token mixes (prose, code, lists) and
//! natural output lengths, not a model's quality.

/// Narrative requests: each asks for prose of a natural length.
pub const NARRATIVE: &[&str] = &[
    "Write a short story about a lighthouse keeper who finds a message in a bottle written in her own handwriting, dated thirty years in the future.",
    "Describe, in the voice of an old ferry captain, the last crossing before the bridge opened and the ferry line closed for good.",
    "Tell the story of a small bakery on a mountain pass during the winter the road stayed closed for six weeks, and how the village kept its bread.",
    "A cartographer is hired to map a town that keeps rearranging its streets at night. Write the first chapter of her field notes.",
    "Write a letter from a retired schoolteacher to the student who, forty years ago, set the chemistry lab on fire, now that the student has become a famous chemist.",
    "Describe a night market in a river port city from the point of view of a lantern seller who has worked the same corner for fifty years.",
    "Write a fable about a tortoise who becomes the keeper of a clock tower and learns why the townspeople never trust the clock.",
    "Two rival orchestras share one rehearsal hall for a summer. Tell the story of the concert that neither of them planned.",
    "Write a travel diary entry from a botanist crossing a salt desert in search of a flower that blooms one day each decade.",
    "Tell the story of a robot repair shop whose owner refuses to fix any machine until it explains what it was doing when it broke.",
    "Describe a family reunion held in a house that is about to be flooded for a new reservoir, told by the youngest cousin.",
    "Write a mystery opening: a museum guard notices that one painting in the gallery has gained a new figure every morning for a week.",
];

/// Code requests: each asks for a program or an explanation of one.
pub const CODE: &[&str] = &[
    "Write a Python function that merges overlapping time intervals given as (start, end) pairs and returns them sorted. Include a few test cases.",
    "Implement a least-recently-used cache in Rust with get and put in O(1), using a HashMap and a doubly linked list stored in a Vec. Explain the design briefly.",
    "Write a C function that parses a dotted IPv4 address string into a 32-bit integer, rejecting malformed input, and show how you would test it.",
    "In TypeScript, write a debounce helper that delays calls until no new call arrived for a given number of milliseconds, with a cancel method.",
    "Write a SQL query that, for each customer, returns their three most recent orders with the order total, using window functions. Describe the tables you assume.",
    "Implement binary search over a sorted array of integers in Go that returns the first index whose value is at least the target. Explain the loop invariant.",
    "Write a Bash script that finds the ten largest files under a directory, prints their sizes in human-readable form, and skips hidden folders.",
    "In Python, write a tokenizer for simple arithmetic expressions with integers, + - * / and parentheses, followed by a recursive-descent evaluator.",
    "Write a Rust function that reads a CSV file of (name, score) rows and prints the median score, handling empty files and malformed rows gracefully.",
    "Explain what this code does and find the bug: a Java method that removes items from an ArrayList while iterating over it with a for-each loop.",
    "Implement a token-bucket rate limiter in C++ that allows bursts up to a capacity and refills at a fixed rate; make it safe to call from several threads.",
    "Write a JavaScript function that deep-compares two JSON-like values, treating object key order as irrelevant, and list the edge cases it handles.",
];

/// A long narrative passage used as filler for fixed-length prompts; cut to the exact token count
/// the workload asks for (and repeated when a prompt needs more).
pub const FILLER: &str = "\
The harbor town of Calder Reach woke each morning to the sound of gulls arguing over the fish \
market roofs. Before the sun cleared the breakwater, the net menders were already at their \
benches, and the smell of tar and coffee drifted up the narrow streets toward the square. Mara \
Ellison, who kept the tide tables for the harbor office, liked to walk the long way to work, past \
the chandlery and the rope walk, because it let her count the boats that had come in during the \
night. She wrote the numbers in a small green notebook that she had carried for eleven years. \
Nobody had ever asked her to do this. The harbor master kept his own records, neat columns in a \
ledger that smelled of pipe smoke, and the customs clerk kept another. But Mara trusted her \
notebook more than either of them, because she had never once written a number she had not seen \
with her own eyes. \
On the morning this story begins, the count did not add up. Thirty-one boats had gone out the \
evening before; the notebook said so, in her careful slanted hand. Thirty-two were moored along \
the quay. She counted twice, then a third time, walking the length of the stone pier and touching \
each mooring post as she passed it, the way her grandfather had taught her to count sheep. The \
extra boat was at the very end, tied with a knot she did not recognize. It was small and painted \
the deep blue of old ink, with no name on the bow and no number on the stern. A coil of rope lay \
on its bench, and beside the rope, a wooden box with brass corners, closed with a simple hook. \
Mara did not open the box. She stood on the pier for a long minute, listening to the water slap \
against the hull, and then she walked to the harbor office and wrote a note for the harbor \
master: one unregistered vessel, end of the north quay, arrived between dusk and dawn, no crew \
seen. She signed it and left it on his desk under the brass paperweight shaped like a whale. By \
noon the whole town knew. The baker had heard it from the postman, who had heard it from the \
harbor master's nephew, and by the time the story reached the school at the top of the hill, the \
little blue boat had become a smuggler's launch, a ghost ship, and the lost tender of a royal \
yacht. The children drew it on their slates with skulls on the sail, though the boat had no sail \
at all. \
The harbor master, a patient man named Oswin Tull, went down to look at it after lunch. He walked \
around it twice, examined the knot, lifted the coil of rope and put it back exactly where it had \
been, and then, because he was a careful man who disliked surprises, he opened the box. Inside \
was a brass instrument he took at first for a compass. It had a needle and a glass face, and \
around the rim, instead of the points of the compass, someone had engraved the names of the \
streets of Calder Reach, every one of them, in tiny precise letters. The needle pointed up the \
hill, toward Lantern Street, and it did not move when he turned the box around. \
Oswin closed the lid, hooked it shut, and carried the box up to the office, where he set it on \
the shelf between the barometer and the tide clock. He told nobody what was inside. For three \
days the needle pointed at Lantern Street. On the fourth day it swung, slowly, as if pushed by a \
tired hand, until it pointed at the chandlery. That afternoon the chandlery caught fire. The fire \
was small and was put out within the hour by the bucket line, and nobody was hurt, but Oswin \
stood at the office window watching the smoke and felt the back of his neck go cold. \
He went to find Mara. She was at her desk, working out the spring tides for the almanac, a column \
of figures running down the page in green ink. He put the box in front of her and opened it \
without a word. She looked at the needle for a long time. Then she took out her notebook, turned \
back through the pages, and began to read him the counts: the boats in, the boats out, the \
weather, the small notes in the margins about who had quarreled with whom on the quay. The \
needle, she said at last, was not predicting anything. It was keeping a record, the way she did. \
It pointed at whatever the town was about to forget. \
";

/// Which prompt set a workload draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptSet {
    /// [`NARRATIVE`].
    #[default]
    Narrative,
    /// [`CODE`].
    Code,
}

impl PromptSet {
    /// The requests of the set.
    pub fn prompts(self) -> &'static [&'static str] {
        match self {
            PromptSet::Narrative => NARRATIVE,
            PromptSet::Code => CODE,
        }
    }

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            PromptSet::Narrative => "narrative",
            PromptSet::Code => "code",
        }
    }
}

/// Filler words starting at word `offset` (wrapping), at least `min_words` long.
pub fn filler_words(offset: usize, min_words: usize) -> Vec<&'static str> {
    let words: Vec<&'static str> = FILLER.split_whitespace().collect();
    let n = words.len();
    (0..min_words.max(1))
        .map(|i| words[(offset + i) % n])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_distinct_and_nonempty() {
        for set in [PromptSet::Narrative, PromptSet::Code] {
            let p = set.prompts();
            assert!(p.len() >= 10);
            let mut d = p.to_vec();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), p.len(), "{} has duplicates", set.name());
        }
        let w = filler_words(5, 2000);
        assert_eq!(w.len(), 2000);
        assert_eq!(w[0], FILLER.split_whitespace().nth(5).unwrap());
    }
}
